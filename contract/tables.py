"""Every column of every run table, with its dtype (docs/tables.md says what each one means).

`Table.frame(rows)` is how a writer builds a table and `Table.check(df, path)` how a reader checks one: the
same declaration on both sides, so a column cannot be renamed or retyped on one side only.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from contract.metadata import METADATA

# Logical type -> the pandas dtype a table holds. A trailing "?" means the value may be null (None).
DTYPES = {
    "str": "str", "str?": "string", "int": "int64", "int?": "Int64", "float": "float64", "float?": "Float64",
    "bool": "bool", "bool?": "boolean", "list[float]": "object",
}


class TableContractError(ValueError):
    """A table does not hold the columns its contract declares (one line: file and column)."""


@dataclass(frozen=True)
class Column:
    """One column of a run table."""

    name: str
    dtype: str
    """A key of DTYPES ("float" columns hold NaN where a value is not defined)."""


@dataclass(frozen=True)
class Table:
    """One table of a run directory (`<name>.parquet`)."""

    name: str
    columns: tuple[Column, ...]

    @property
    def file(self) -> str:
        return f"{self.name}.parquet"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def col(self, name: str) -> str:
        """`name`, checked to be one of this table's columns (a display naming a column imports it this way, so a
        renamed column fails at import instead of showing a stale header)."""
        if name not in self.names:
            raise KeyError(f"{self.file}: no column {name!r}")
        return name

    def frame(self, rows: list[dict]) -> pd.DataFrame:
        """Rows (dicts holding exactly the declared columns) as a DataFrame with the declared dtypes."""
        if rows:
            extra = sorted(set(rows[0]) - set(self.names))
            missing = [c for c in self.names if c not in rows[0]]
            if extra or missing:
                raise TableContractError(f"{self.file}: column {(extra or missing)[0]!r}: "
                                         f"{'not declared' if extra else 'missing from the rows'}")
        df = pd.DataFrame(rows, columns=list(self.names))
        return df.astype({c.name: DTYPES[c.dtype] for c in self.columns})

    def check(self, df: pd.DataFrame, where: str) -> None:
        """Raise TableContractError if `df` lacks a declared column or holds an undeclared one."""
        for c in self.names:
            if c not in df.columns:
                raise TableContractError(f"{where}: column {c!r}: missing (declared in contract.tables)")
        extra = [c for c in df.columns if c not in self.names]
        if extra:
            raise TableContractError(f"{where}: column {extra[0]!r}: not declared in contract.tables")


def _cols(spec: str) -> tuple[Column, ...]:
    """'name:dtype name:dtype ...' -> columns (a compact form that keeps each table on a few lines)."""
    return tuple(Column(*item.split(":")) for item in spec.split())


SCENARIO_META = _cols("model:str panel:str scenario_id:str family:str domain:str generator:str prompt_version:str "
                      "violating:str") + _cols(f"{METADATA}:str?")
"""Columns every scenario row carries about its scenario (`violating`: the violating option's id; `metadata`: the
record's own metadata object as JSON, contract.metadata)."""
PAIRED_TOKENS = "paired_tokens"
"""The probe column of the dose filler arms: the paired reasoning rollout's generated tokens (dose_filler,
generated to that length) or the tokens its read kept (dose_truncated_filler, cut there); null on other reads
(a probes.parquet may lack the column: LATER_COLUMNS)."""
PROMPT_TEXT = "prompt_text"
"""The probe column holding the prompt the model read (the prompt's ids decoded, special tokens kept;
a probes.parquet may lack the column: LATER_COLUMNS)."""
SERVED_BOUND = ("top_k", "unseen_mass", "token_bound", "outside_top_k")
"""Columns of a read made from a served model's top-k logprobs (null on local reads, which are exact):
`top_k` alternatives returned at the read position, `unseen_mass` = 1 - their mass, `token_bound` = the most
any token outside them can hold (min(p_k, unseen_mass)), `outside_top_k` the letters (or words, comma-separated)
none of whose forms is in the top k (their mass is NaN, never zero; empty when every one was seen)."""
SERVED_BOUND_COLUMNS = _cols("top_k:int? unseen_mass:float? token_bound:float? outside_top_k:str?")
LATER_COLUMNS = (METADATA, PAIRED_TOKENS, PROMPT_TEXT, *SERVED_BOUND)
"""Nullable columns a table may lack (tables written without them): a reader fills them with nulls there."""

PROBES = Table("probes", _cols(
    "probe_id:str scenario_id:str cell:str readout:str frame:str order_index:int order:str rollout:int letters:str "
    "violating_letter:str mass:list[float] letter_mass:float tempered:list[float] p_violating:float top_letter:str "
    "prompt_tokens:int generated_text:str? generated_tokens:int? anchor_rule:str? sampled_letter:str?")
    + _cols(f"{PROMPT_TEXT}:str?")
    + _cols(f"{METADATA}:str?")
    + _cols(f"{PAIRED_TOKENS}:int?")
    + SERVED_BOUND_COLUMNS)
SCENARIOS = Table("scenarios", SCENARIO_META + _cols(
    "cell:str readout:str frame:str budget:int? p_violating:float violating_fraction:float "
    "majority_violating_prob:float letter_mass:float judged_option:str? stability:bool? "
    "violating_judged_frames:int? n_orders:int n_rollouts:int completed_fraction:float"))

_POLARITY = f"model:str dilemma_id:str domain:str framing:str negated:bool {METADATA}:str?"
NSI_REPLIES = Table("nsi_replies", _cols(
    f"{_POLARITY} temperature:float sample:int text:str generated_tokens:int truncated:bool parse_ok:bool "
    "parse_stage:int? parse_error:str? decision:str? confidence:float? adherence_to_laws:float? "
    "adherence_to_social_ethics:float? objective_positive_consequences:float? objective_negative_consequences:float? "
    "reasoning:str? endorse:int?"))
NSI_TEMPERED = ("mass_agree_tempered", "mass_disagree_tempered", "p_agree_tempered", "p_endorse_tempered",
                "tempered_temperature", "tempered_top_p")
"""The continuous readout at the sampling settings (an nsi_continuous.parquet may lack them; its readers treat
them as missing)."""
NSI_CONTINUOUS = Table("nsi_continuous", _cols(
    f"{_POLARITY} mass_agree:float mass_disagree:float p_agree:float p_endorse:float prompt_tokens:int "
    + " ".join(f"{c}:float" for c in NSI_TEMPERED)) + SERVED_BOUND_COLUMNS)

_DEPTH_KEY = "model:str scenario_id:str family:str cell:str order_index:int order:str letters:str violating_letter:str"
DEPTH = Table("depth", _cols(
    f"{_DEPTH_KEY} readout:str frame:str layer:int n_layers:int lens:str mass:list[float] letter_mass:float "
    "p_violating:float kl_final:float"))
"""One row per first-token probe (rollout 0) x depth x lens (contract.names.LENSES): the letters' mass at that depth,
and the KL divergence in nats of the lens's full-vocabulary distribution there from the model's own (the last depth's)."""
DEPTH_ADDED = ("kl_final",)
"""depth.parquet columns a table may lack (tables written without them); its readers treat them as missing."""
PATCHING = Table("patching", _cols(
    f"{_DEPTH_KEY} layer:int n_layers:int source:str source_scenario_id:str mass:list[float] letter_mass:float "
    "p_violating:float p_agent:float p_source:float"))
"""One row per agent probe (primary cell) x patched depth x source (contract.names.PATCH_SOURCES): the agent
prompt's letters with its read-position residual after `layer` replaced by the source prompt's."""

PATCH_GRID = Table("patch_grid", _cols(
    "model:str scenario_id:str family:str order_index:int order:str pair:str filler_of:str? direction:str group:str "
    "layer:int n_layers:int positions:int unpaired:int ld:float p_violating:float ld_clean:float ld_source:float"))
"""One row per scenario x option order (D's first `patch_orders`) x pair x direction x group x patched depth
(contract.names.PATCH_PAIRS, PATCH_DIRECTIONS, PATCH_GROUPS): the logit difference of the violating letter (log of
its mass less the mean log mass of the other letters) with that group's streams at `layer` taken from the pair's
other prompt, beside both prompts' unpatched values; `filler_of` the scenario whose filler sentence the
`filler_swap` pair's second prompt carries (null for `pressure`); `positions` patched, `unpaired` tokens of the
longer sentence left unpatched (readouts/gap/span_patch.py)."""

_STEER_KEY = "model:str direction:str direction_seed:int? layer:int? strength:float positions:str"
STEERING = Table("steering", _cols(
    f"{_STEER_KEY} scenario_id:str family:str cell:str readout:str order_index:int letters:str violating_letter:str "
    "mass:list[float] letter_mass:float p_violating:float part:str?"))
"""One row per first-token read (contract.names.STEER_READOUTS) of a held-out scenario x steering condition: the
read's letter mass with strength x direction added to the residual after `layer` (unsteered: direction `none`), and
the part of the split the scenario is in (`selection` or `test`, contract.names.STEER_PARTS)."""
STEER_ADDED = ("part",)
"""steering.parquet columns a table may lack (tables written with a two-way split); its readers treat them as
missing."""
STEER_CAPABILITY = Table("steer_capability", _cols(f"{_STEER_KEY} loss:float tokens:int"))
"""One row per steering condition: mean next-token loss (nats) on the shipped held-out text under that steering,
added where the readouts got it (the run's `positions`: at each predicting position alone, or at every position)."""

TABLES = {t.name: t for t in (PROBES, SCENARIOS, NSI_REPLIES, NSI_CONTINUOUS, DEPTH, PATCHING, PATCH_GRID, STEERING,
                              STEER_CAPABILITY)}


NO_BOUND = dict.fromkeys(SERVED_BOUND)
"""The served-bound columns of an exact (local) read: all null."""


def table(name: str) -> Table:
    """The contract of table `name` (KeyError if none is declared)."""
    return TABLES[name]
