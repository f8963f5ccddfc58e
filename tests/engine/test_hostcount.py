"""The host-work counter (engine/hostcount.py): aten operations apart from views, and each kind of host
synchronization counted once, also under inference_mode (where scalar reads reach no dispatch mode)."""

import pytest
import torch

from engine.hostcount import HostCounter


@pytest.mark.parametrize("inference", [True, False])
def test_counts_ops_views_and_syncs(inference):
    x = torch.arange(6.0)
    with torch.inference_mode(inference), HostCounter() as c:
        y = (x * 2 + 1).view(2, 3).t()  # two ops, two views
        bool(y.any())
        y.sum().item()
        x.nonzero()
        x[x > 2]
        x.tolist()
        x.cpu()
        x.to("cpu")
        x.to(x.device)  # the model code's idiom: no copy on an accelerator
    assert c.syncs == {"scalar_read": 2, "data_shape": 2, "to_host": 3}
    assert c.views >= 2
    # mul, add, any, sum, nonzero, gt, index (and the scalar reads' own ops where they are dispatched)
    assert 7 <= c.ops <= 9


def test_nothing_outside_the_block():
    x = torch.ones(3)
    with HostCounter() as c:
        pass
    x.tolist()
    bool(x.all())
    assert c.sync_count == 0 and c.ops == 0
