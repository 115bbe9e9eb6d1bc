"""Auto mode's cost model: how long a speculative round takes, measured, and the draft length
(0 included: plain decoding) of most expected tokens per second.

    cost = DecodeCost.prior(verify_s=0.004, draft_token_s=0.002)   # or models.lm.speculative.calibrate
    session = cost.session(k_max=8)                                 # one per generation
    k = session.choose()                                            # 0: this round decodes plainly
    ...; session.observe_draft(k, s); session.observe_verify(k + 1, s); session.observe_acceptance(kept, k)

A round drafts K tokens (a fixed part, the draft catching up with the verified text, plus K
drafted tokens) and verifies them in one target call over K + 1 tokens (a fixed part plus a part
per token). Both are straight lines in K, fitted to the round's own timings with exponentially
decayed weights starting from a prior (a calibration at load), so the model follows the machine's
load. With per-token acceptance ``a``, a round keeps ``(1 − a^(K+1)) / (1 − a)`` tokens on average
(Leviathan et al. 2023); K = 0 keeps exactly one at the cost of one target call over one token.
The acceptance rate runs within a generation and starts from where the earlier ones left it.

When plain decoding wins, nothing new is learnt about acceptance; a probe (one round of K = 1)
follows after ``probe_rounds`` plain rounds, the wait doubling each time plain decoding still wins,
and probes take at most a small share of the generation's time. When a draft cannot pay even if
every token were accepted (its tokens cost more than the target call they save), it is never
probed at all: auto mode then costs plain decoding plus a few arithmetic operations a round. In
a run of plain rounds the cost model's choice (about 1 % of a tiny target's token to work out) is
looked at again every ``recheck_rounds`` rounds only: the acceptance it rests on does not change
there, only the timings do.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from edge.llm.acceptance import AcceptanceRate


@dataclass
class Line:
    """``seconds ≈ fixed_s + per_s · n``, fitted by exponentially decayed least squares from a
    prior line worth ``weight`` observations at n = 1 and n = ``spread``."""

    fixed_s: float
    per_s: float
    decay: float = 0.95
    weight: float = 2.0
    spread: int = 5
    _sums: list[float] = field(default_factory=list, repr=False)  # s, sn, snn, st, snt

    def __post_init__(self) -> None:
        if self.fixed_s < 0 or self.per_s < 0:
            raise ValueError(f"fixed_s = {self.fixed_s}, per_s = {self.per_s}: times must be >= 0")
        self._sums = [0.0] * 5
        for n in (1, self.spread):
            self._add(n, self.fixed_s + self.per_s * n, self.weight / 2)

    def _add(self, n: float, seconds: float, w: float) -> None:
        for i, v in enumerate((1.0, n, n * n, seconds, n * seconds)):
            self._sums[i] += w * v

    def observe(self, n: int, seconds: float) -> None:
        """One timing of ``n`` units (drafted or verified tokens)."""
        self._sums = [self.decay * s for s in self._sums]
        self._add(float(n), max(float(seconds), 0.0), 1.0)
        s, sn, snn, st, snt = self._sums
        det = s * snn - sn * sn
        if det > 0.25 * s * s:  # the weighted n vary by half a unit or more: fit both
            self.per_s = max((s * snt - sn * st) / det, 0.0)
        # else the recent timings are all at about one n: keep the slope, move the level
        self.fixed_s = max((st - self.per_s * sn) / s, 0.0)

    def seconds(self, n: int) -> float:
        return self.fixed_s + self.per_s * n


def expected_tokens(rate: float, k: int) -> float:
    """Tokens a round of K drafted tokens adds on average at per-token acceptance ``rate``."""
    rate = min(max(rate, 0.0), 0.999)
    return (1 - rate ** (k + 1)) / (1 - rate)


class DecodeCost:
    """The measured cost of drafting and of verifying, and the choice of K they imply (module doc).
    Shared by every generation of one server: updates take a lock."""

    def __init__(self, draft: Line, verify: Line, probe_rounds: int = 8, max_probe_rounds: int = 256) -> None:
        self.draft, self.verify = draft, verify
        self.probe_rounds, self.max_probe_rounds = probe_rounds, max_probe_rounds
        self.acceptance = AcceptanceRate(decay=0.98)  # over every generation: where the next one starts
        self._lock = threading.Lock()

    @classmethod
    def prior(cls, verify_s: float, draft_token_s: float, verify_token_s: float = 0.0, draft_round_s: float = 0.0,
              **options: int) -> DecodeCost:
        """A cost model from single measurements (a target call over one token, a drafted token)."""
        return cls(Line(draft_round_s, draft_token_s), Line(max(verify_s - verify_token_s, 0.0), verify_token_s), **options)

    def round_s(self, k: int) -> float:
        """Seconds of a round drafting ``k`` tokens (0: one plain target call)."""
        drafting = self.draft.seconds(k) if k > 0 else 0.0
        return drafting + self.verify.seconds(k + 1)

    def speed(self, rate: float, k: int) -> float:
        """Expected tokens per second of rounds drafting ``k`` tokens at acceptance ``rate``."""
        return expected_tokens(rate, k) / max(self.round_s(k), 1e-12)

    def best_k(self, rate: float, k_max: int) -> int:
        """The K in 0..k_max of most expected tokens per second (ties: the shorter draft)."""
        speeds = [self.speed(rate, k) for k in range(k_max + 1)]
        return max(range(k_max + 1), key=lambda k: (speeds[k], -k))

    def can_pay(self, k_max: int) -> bool:
        """Whether some K ≥ 1 beats plain decoding were every drafted token accepted."""
        return self.best_k(1.0, k_max) > 0

    def session(self, k_max: int, plan: tuple[int, ...] = ()) -> AutoSession:
        """The per-generation state (probe schedule) over this shared model; ``plan``: draft lengths
        to use first, whatever the model says (a calibration)."""
        return AutoSession(self, k_max, plan=list(plan))

    def observe_draft(self, k: int, seconds: float) -> None:
        with self._lock:
            self.draft.observe(k, seconds)

    def observe_verify(self, n: int, seconds: float) -> None:
        with self._lock:
            self.verify.observe(n, seconds)

    def observe_acceptance(self, kept: int, drafted: int) -> None:
        with self._lock:
            self.acceptance.update(kept, drafted)

    def __repr__(self) -> str:
        d, v = self.draft, self.verify
        return (f"DecodeCost(draft {1e3 * d.fixed_s:.2f} ms + {1e3 * d.per_s:.2f} ms/token, "
                f"verify {1e3 * v.fixed_s:.2f} ms + {1e3 * v.per_s:.2f} ms/token)")


@dataclass
class AutoSession:
    """One generation's choices: the cost model's best K, with probes after runs of plain rounds.
    Probes are capped at ``explore_share`` of the generation's time so far, counting the next one
    at its expected cost (a probe of a draft that lags far behind the text also pays for its
    catch-up): auto mode is about that much slower than plain decoding where no draft pays, and a
    short generation is not probed at all."""

    cost: DecodeCost
    k_max: int
    plan: list[int] = field(default_factory=list)  # draft lengths to use first (a calibration)
    explore_share: float = 0.02
    plain: int = 0  # plain rounds since the last drafting round
    wait: int = 0  # plain rounds before the next probe
    elapsed_s: float = 0.0  # drafting and verifying so far
    probe_s: float = 0.0  # of which drafting in probes
    probing: bool = False
    planned: bool = False
    steady: bool = False  # this round follows a drafting round
    recheck_rounds: int = 8  # in a run of plain rounds, the cost model's best K is looked at every this many
    pays: bool = True  # whether a draft could pay at all, as of the last look
    ks: list[int] = field(default_factory=list)  # what each round chose
    acceptance: AcceptanceRate = field(default_factory=AcceptanceRate)

    def __post_init__(self) -> None:
        if self.k_max < 0 or any(not 0 <= k <= self.k_max for k in self.plan):
            raise ValueError(f"k_max = {self.k_max}, plan {self.plan}: need 0 <= K <= k_max")
        self.wait = self.cost.probe_rounds
        # this generation's running acceptance starts where the earlier ones left it
        self.acceptance = AcceptanceRate(kept=3 * self.cost.acceptance.rate, tried=3.0)

    def choose(self) -> int:
        """This round's draft length."""
        self.steady = bool(self.ks) and self.ks[-1] > 0  # the last round drafted too: the draft is caught up
        self.probing = self.planned = False
        if self.plan:
            self.planned = True
            self.ks.append(self.plan.pop(0))
            return self.ks[-1]
        k = 0
        if self.plain % self.recheck_rounds == 0:  # drafting, or a look again from a run of plain rounds
            k = self.cost.best_k(self.acceptance.rate, self.k_max)
            self.pays = k > 0 or self.cost.can_pay(self.k_max)
        if k > 0:
            self.plain, self.wait = 0, self.cost.probe_rounds
        elif self.k_max > 0:
            self.plain += 1
            # acceptance may have changed since the last draft: look again, within the budget
            budget = self.explore_share * self.elapsed_s - self.probe_s
            if self.plain > self.wait and self.pays and self.cost.draft.seconds(1) <= budget:
                k, self.plain, self.probing = 1, 0, True
                self.wait = min(2 * self.wait, self.cost.max_probe_rounds)
        self.ks.append(k)
        return k

    def observe_draft(self, k: int, seconds: float) -> None:
        """A drafting round's time (the draft catching up with the verified text, then ``k`` tokens).
        Only a round right after another drafting round teaches the cost model: after plain rounds
        the draft also catches up on the text it skipped, a cost of switching, not of drafting
        (counted against the probes' share all the same)."""
        self.elapsed_s += seconds
        if self.probing:
            self.probe_s += seconds
        if self.steady:
            self.cost.observe_draft(k, seconds)

    def observe_verify(self, n: int, seconds: float) -> None:
        self.elapsed_s += seconds
        self.cost.observe_verify(n, seconds)

    def observe_acceptance(self, kept: int, drafted: int) -> None:
        """``kept`` of ``drafted`` tokens kept this round (a calibration's made-up text teaches nothing)."""
        self.acceptance.update(kept, drafted)
        if not self.planned:
            self.cost.observe_acceptance(kept, drafted)
