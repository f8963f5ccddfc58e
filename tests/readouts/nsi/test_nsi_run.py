"""`readout nsi` on tiny models: every reply kept as a row with its parse outcome, the continuous
P(agree) equal to the plain forward pass on the rendered prefix, resume and manifest as for the gap study."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from engine.errors import ReadoutError
from engine.letters import word_start_tokens
from engine.render import Prompt, encode_prompt
from engine.sampling import tempered_distribution
from engine.scoring import plain_next_token_logits
from panels.frames import render_polarity
from panels.schema import load_panel
from readouts.driver import Interrupted, ModelOptions, RunOptions, run
from readouts.nsi import study as nsi_module
from readouts.nsi.profile import NsiProfile
from readouts.nsi.recipe import DECISION_PREFIX, decision_words
from readouts.nsi.study import NsiStudy
from tests.helpers import get_model


@pytest.fixture(autouse=True)
def short_budget(monkeypatch):
    monkeypatch.setitem(nsi_module.PROFILES, "quick", NsiProfile(name="quick", chunk_size=2, samples=2, budget=12))


def nsi(tmp_path, name, model="tiny-llama3", samples=2, **kw):
    """`readout nsi` through the driver, as the CLI calls it (`--samples` is the `samples` override)."""
    logs = []
    options = RunOptions(model=ModelOptions(model), overrides=(f"samples={samples}",),
                         **{"out": str(tmp_path / name), "progress": False, **kw})
    return run(NsiStudy(), options, log=logs.append), logs


def test_replies_and_continuous_tables(tmp_path):
    path, logs = nsi(tmp_path, "a")
    replies = pd.read_parquet(path / "nsi_replies.parquet")
    assert len(replies) == 14 * 4 * 3  # every reply kept, parsed or not
    assert set(replies.temperature) == {0.0, 0.7} and (replies[replies["sample"] == 0].temperature == 0.0).all()
    assert replies.parse_error[~replies.parse_ok].notna().all()
    assert set(replies.negated[replies.framing.isin(["F1", "F3"])]) == {True}
    cont = pd.read_parquet(path / "nsi_continuous.parquet")
    assert len(cont) == 56
    assert ((cont.p_endorse - cont.p_agree).abs() < 1e-12).eq(~cont.negated).all()
    assert any(line.startswith("tables:") for line in logs)
    # The quick settings are not the paper's, and the run says so in its summary.
    note = [line for line in logs if "is not the paper's settings" in line]
    assert len(note) == 1 and "samples 2 (paper 30)" in note[0] and "budget 12 (paper 4096)" in note[0]
    from stats.nsi import run_nsi_stats  # the analysis reads what the readout wrote, nullable dtypes included

    headlines = run_nsi_stats([path], None, seed=0, n_null=200, n_boot=200)
    assert any("continuous NSI" in line for line in headlines)
    assert (path / "stats" / "fig_acquiescence.png").exists() and (path / "stats" / "fig_nsi_heatmap.png").exists()


def test_continuous_readout_equals_plain_forward(tmp_path):
    path, _ = nsi(tmp_path, "b", samples=0)
    cont = pd.read_parquet(path / "nsi_continuous.parquet").set_index(["dilemma_id", "framing"])
    lm = get_model("tiny-llama3")
    tok = lm.tokenizer
    words = decision_words(tok)
    checked = []
    for d in load_panel("nsi-14").records[:3]:
        for framing in ("F0", "F3"):
            ids = encode_prompt(tok, Prompt(messages=render_polarity(d, framing).messages))
            ids += tok.encode(DECISION_PREFIX, add_special_tokens=False)
            logits = plain_next_token_logits(lm.model, ids)
            probs = logits.softmax(-1)
            agree = float(probs[list(words.token_ids[0])].sum())
            disagree = float(probs[list(words.token_ids[1])].sum())
            row = cont.loc[(d.id, framing)]
            assert row.mass_agree == pytest.approx(agree, abs=1e-5)
            assert row.p_agree == pytest.approx(agree / (agree + disagree), abs=1e-5)
            # The same read at the profile's sampling settings (T 0.7 after the top-p 0.95 cut).
            assert (row.tempered_temperature, row.tempered_top_p) == (0.7, 0.95)
            tempered = tempered_distribution(logits[None].float(), 0.7, 0.95)[0]
            t_agree = float(tempered[list(words.token_ids[0])].sum())
            t_disagree = float(tempered[list(words.token_ids[1])].sum())
            assert row.mass_agree_tempered == pytest.approx(t_agree, abs=1e-5)
            if t_agree + t_disagree > 0:
                assert row.p_agree_tempered == pytest.approx(t_agree / (t_agree + t_disagree), abs=1e-5)
                assert row.p_endorse_tempered == pytest.approx(
                    1 - row.p_agree_tempered if framing == "F3" else row.p_agree_tempered, abs=1e-12)
            else:
                assert np.isnan(row.p_agree_tempered)
            unsharpened = agree / (agree + disagree)
            checked.append(row.p_agree_tempered != pytest.approx(unsharpened, abs=1e-4))
    assert any(checked)  # the two settings differ somewhere: the tempered columns are not the T = 1 ones
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["continuous_settings"][1] == {"temperature": 0.7, "top_p": 0.95, "columns": "p_agree_tempered"}


@pytest.mark.smollm
def test_word_start_tokens():
    tok = get_model("smollm2-135m").tokenizer
    words = word_start_tokens(tok, ("agree", "disagree"))
    agree = set(words.decoded[0])
    assert "agree" in agree or "ag" in agree
    assert all("agree".startswith(t) or t.startswith("agree") for t in agree)
    assert not set(words.token_ids[0]) & set(words.token_ids[1])
    assert torch.tensor(words.token_ids[1]).numel() > 0


def test_resume_and_refusal(tmp_path):
    with pytest.raises(Interrupted):
        nsi(tmp_path, "c", samples=0, stop_after_chunks=3)
    path, logs = nsi(tmp_path, "c", samples=0)
    assert sum(line.startswith("chunk") and "already finished" in line for line in logs) == 3
    full, _ = nsi(tmp_path, "d", samples=0)
    pd.testing.assert_frame_equal(pd.read_parquet(path / "nsi_continuous.parquet"), pd.read_parquet(full / "nsi_continuous.parquet"))
    with pytest.raises(ReadoutError, match="profile"):
        nsi(tmp_path, "c", samples=1)


def test_bad_nsi_input(tmp_path):
    with pytest.raises(ReadoutError, match="reads nsi panels"):
        nsi(tmp_path, "e", panel="gap-v1")
    with pytest.raises(ReadoutError, match="no chat template"):
        nsi(tmp_path, "e", model="tiny-base")


def test_negative_samples_refused_before_the_model_loads(tmp_path):
    with pytest.raises(ReadoutError, match="--samples"):
        nsi(tmp_path, "f", model="no-such-model", samples=-1)


def test_settings_note_names_every_field_that_differs_from_the_paper():
    from readouts.nsi.profile import PROFILES, settings_note

    assert settings_note(PROFILES["paper"]) is None
    quick = settings_note(NsiProfile(name="quick", chunk_size=2, samples=4, budget=96))
    assert "profile 'quick' is not the paper's settings" in quick and "temperature" not in quick
    assert "samples 4 (paper 30)" in quick and "budget 96 (paper 4096)" in quick


@pytest.mark.smollm
def test_decision_word_rule_leaves_out_single_letters():
    """The continuous readout's token rule: word-start tokens of two or more characters; "a" and "d" start too
    many other words to count."""
    tok = get_model("smollm2-135m").tokenizer
    allowed = word_start_tokens(tok, ("agree", "disagree"))
    words = decision_words(tok)
    assert [set(d) for d in words.decoded] == [{"ag", "agree"}, {"di", "dis"}]
    for ids, texts, all_ids in zip(words.token_ids, words.decoded, allowed.token_ids):
        assert set(ids) <= set(all_ids) and all(len(t) >= 2 for t in texts)
    assert {"a", "d"} <= {t for d in allowed.decoded for t in d}  # what the rule removes
