"""The training programs that ms_recover's demo and benchmarks run as rank processes.

Each module is a program (``python -m ms_recover.mindspore.programs.<name>``), not library code:

* :mod:`.demo_train`: the demo's MLP, a hand-written loop with ``DataParallelStep``;
* :mod:`.overhead_train`: ``ms-recover bench overhead``'s rank program (plain vs. session);
* :mod:`.ckpt_train`: ``bench recovery``'s checkpoint-restart baseline (started through
  :mod:`ms_recover.bench.ckpt_train`, which times the MindSpore import);
* :mod:`.allreduce_bench`: one process of MindSpore's own CPU cluster for ``bench allreduce``.

They live under ``ms_recover/mindspore/`` because they import MindSpore. The MindSpore-free
numpy trainer lives in :mod:`ms_recover.localrun.numpy_trainer`: importing anything
under ``ms_recover.mindspore`` imports MindSpore (about 2 s and 420 MB per rank process).
Each program ends by writing a rank record (:mod:`ms_recover.worker.record`). The tests' own
programs (``Model.train``, MindSpore's TFT on CPU) are in the repository's ``tests/kit/``.
"""
