"""What a training script imports: the top-level names and the MindSpore package's."""

from __future__ import annotations

import ms_recover
from ms_recover.worker import sampler


def test_the_sampler_is_public_at_the_top_level() -> None:
    assert ms_recover.shard_indices is sampler.shard_indices
    assert ms_recover.make_dataset is sampler.make_dataset
    assert ms_recover.split_indices is sampler.split_indices
    assert {"shard_indices", "make_dataset", "split_indices", "__version__"} <= set(
        ms_recover.__all__
    )
    assert all(hasattr(ms_recover, name) for name in ms_recover.__all__)


def test_the_mindspore_package_exports_the_recommended_step() -> None:
    import ms_recover.mindspore as msr_ms

    assert {"GraphStep", "MindSporeState", "fit", "ShardedArrays"} <= set(msr_ms.__all__)
