"""The estimate (``memlab_rs.estimate``): a training step's memory without allocating it.
``estimator`` runs the step on fake tensors (``_fake_step``) and has Rust replay its
recording through an allocator model (``_core.estimate``); ``result`` is the estimate as
data (kind ``estimate``); ``search`` is ``max_batch_size``; ``what_if`` is ``plan``, the
what-if plan (``plan_result``: kind ``plan``). The package is not named
``estimate``: that is the public function, and no module may shadow it."""

from memlab_rs.estimation._fake_step import FakeStepError
from memlab_rs.estimation.estimator import estimate
from memlab_rs.estimation.plan_result import MemoryPlan
from memlab_rs.estimation.result import MemoryEstimate
from memlab_rs.estimation.search import max_batch_size
from memlab_rs.estimation.what_if import plan

__all__ = ["FakeStepError", "MemoryEstimate", "MemoryPlan", "estimate", "max_batch_size", "plan"]
