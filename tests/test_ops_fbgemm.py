"""The differential tier against fbgemm_gpu (``pytest -m fbgemm``): each family's ``FBGEMM`` rows
(``tests/tables/<family>.py``), embnum (ref and cpu) against fbgemm_gpu's CPU operator on drawn
inputs. ``tests/test_ops.py`` checks that every op has a row or a reason in ``NO_FBGEMM_PEER``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings

from harness import check_fbgemm, fbgemm
from tables import peers, strategy

pytest.importorskip("torch")


@pytest.mark.fbgemm
@pytest.mark.parametrize("peer", peers(), ids=lambda p: p.op + (f"-{p.case}" if p.case else ""))
def test_fbgemm(peer):
    """One ``FBGEMM`` row: embnum (ref and cpu) against fbgemm_gpu on drawn inputs."""
    fbgemm()

    @settings(max_examples=peer.examples, suppress_health_check=[HealthCheck.too_slow])
    @given(args=peer.strategy if peer.strategy is not None else strategy(peer.op))
    def run(args):
        if peer.adapt is not None:
            args = peer.adapt(args)
            assume(args is not None)
        check_fbgemm(peer, args)

    run()
