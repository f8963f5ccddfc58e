"""Model organisms: LoRA adapters on the embedded SmolLM2-135M-Instruct with a planted behaviour of a known size
(a judgment-action gap, its null, a raw-frame reversal, a position bias, negation blindness and coherence), so
that the whole instrument can be held to a known answer.

The package sits above `readouts/`: it imports engine, panels and the studies' own read plans (so an organism is
trained on exactly the token ids the readouts read), and only the command line (cli/) imports it. `recipes` declares
each organism, `examples` turns a recipe into training examples through the project's frames and renderer, `train`
fits the adapter, `reference` computes an organism's true values by a plain forward pass, `demo` runs the quick
study on the base model and on an organism; `readout organism ...` is cli/organism.py. The trained adapters ship in
`organisms/data/<name>/`.
"""

from __future__ import annotations

from pathlib import Path

from contract.names import ADAPTER_RECIPE

SHIPPED = Path(__file__).parent / "data"
"""Where the shipped organisms' adapter folders are."""
RECIPE_FILE = ADAPTER_RECIPE


def shipped_path(name: str) -> Path | None:
    """The adapter folder of a shipped organism called `name`, or None if there is none (no torch import)."""
    folder = SHIPPED / name
    return folder if (folder / "adapter_config.json").is_file() else None


def resolve_adapter(value: str | None) -> str | None:
    """A `--peft` value: a folder as given, or the folder of the shipped organism of that name."""
    from engine.errors import ReadoutError
    from organisms.recipes import ORGANISMS

    if value is None or Path(value).expanduser().is_dir():
        return value
    found = shipped_path(value)
    if found is not None:
        return str(found)
    raise ReadoutError(f"--peft: {value}: no such adapter folder, and no shipped organism of that name "
                       f"({', '.join(ORGANISMS)})")
