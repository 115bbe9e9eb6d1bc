"""Node design by Bayesian optimisation over the simulator: ``trickle design SPEC.toml``.

    spec = load_spec("examples/design/indoor_node.toml")
    study = run_study(spec, base_dir, out_dir, workers=2)

``spec`` (what to choose, the cases, objectives, constraints, the capacitor catalogue),
``search`` (evaluations over cases and seeds, Optuna's GP sampler, resumable studies),
``report`` (design.md, design.html, the best designs as scenario files).
"""

from models.design.search import Evaluation, evaluate, run_study
from models.design.spec import DesignSpec, load_spec

__all__ = ["DesignSpec", "Evaluation", "evaluate", "load_spec", "run_study"]
