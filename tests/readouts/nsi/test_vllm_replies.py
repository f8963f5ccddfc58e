"""The NSI replies drawn by vLLM (`--generator vllm`) on the embedded SmolLM2 in float32: the greedy replies are
the own decoder's, token for token, and the run writes its tables as with the own decoder."""

import pandas as pd
import pytest

from readouts.options import Generation
from tests.served_helpers import SERVED_NAME

pytestmark = [pytest.mark.smollm, pytest.mark.served]


def test_nsi_replies_drawn_by_vllm_equal_the_own_decoders_greedy_replies(served_server, tmp_path):
    from readouts.driver import ModelOptions, RunOptions, run
    from readouts.nsi.study import NsiStudy

    tables = {}
    for name, generation in (("own", Generation()), ("vllm", Generation("vllm", served_server.url, SERVED_NAME))):
        options = RunOptions(model=ModelOptions("smollm2-135m"), profile="quick", limit=1, out=str(tmp_path / name),
                             overrides=("budget=32", "samples=1"), progress=False, generation=generation)
        path = run(NsiStudy(), options, log=lambda _line: None, result=lambda _line: None)
        tables[name] = pd.read_parquet(path / "nsi_replies.parquet").sort_values(["dilemma_id", "framing", "sample"])
    own, drawn = tables["own"], tables["vllm"]
    assert len(own) == len(drawn) == 8
    greedy = own["sample"] == 0
    assert own[greedy].text.tolist() == drawn[greedy.values].text.tolist()
