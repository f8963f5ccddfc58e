"""Which checkpoints the vLLM generator can draw from on this CPU, and what it says of the others: every tiny
family's attention head size (16) is one vLLM's CPU backend lacks, so the generator refuses them in one line before
starting anything, and a server started on one anyway dies with that cause, which the generator's error names
(the embedded SmolLM2, head size 64, is served: tests/engine/test_vllm_generation.py holds its greedy texts equal
to the own decoder's)."""

import pytest

from engine.served_client import ServedError
from engine.tiny import ensure_tiny
from engine.vllm_generation import GeneratorSpec, VllmGenerator, start_generator
from engine.vllm_server import CPU_HEAD_SIZES, ServerSettings, VllmServer, VllmUnavailable
from tests.helpers import TINY, get_model
from tests.served_helpers import require_server


@pytest.mark.parametrize("family", TINY)
def test_a_tiny_family_is_refused_before_a_server_starts(family):
    lm = get_model(family)
    cfg = lm.model.config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert head not in CPU_HEAD_SIZES
    with pytest.raises(VllmUnavailable, match=f"head size {head} is not one of"):
        start_generator(lm)


@pytest.mark.served
def test_a_server_started_on_an_unservable_family_dies_with_its_cause_named(tmp_path):
    lm = get_model("tiny-llama3")
    settings = ServerSettings(model_dir=str(ensure_tiny("tiny-llama3")), name="tiny", max_model_len=lm.max_positions)
    with VllmServer(settings, python=require_server(), log=tmp_path / "server.log") as server:
        gen = VllmGenerator(GeneratorSpec(url=server.url, model="tiny", identity={}, cache=str(tmp_path)), server=server)
        with pytest.raises(ServedError) as err:
            gen(lm.model, [(4, 5, 6, 7)], max_new_tokens=4, stop_ids=frozenset())
    message = str(err.value)
    assert "\n" not in message and "has died" in message and "head_dim=16" in message
