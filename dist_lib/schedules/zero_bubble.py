"""Zero Bubble's automatic-scheduling heuristic: each stage's order of F, I and W passes.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), sec. 3.1, as the paper's reference implementation
runs it (sail-sg/zero-bubble-pipeline-parallelism, auto_schedule.py), with crossings counted one at a time on
each stage's link. With equal pass times and `limit = p` the step is ZB-H1's, 3m + p - 1 units (1F1B's
3m + 3(p - 1)). The rule, the choices tried and why: docs/reference/strategies.md, "Zero Bubble's order".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

Order = list[tuple[str, int]]  # one stage's passes in turn: ("F" | "I" | "W", microbatch)


class _Layout:
    """One trial layout: each stage's clock, pass ends, counts and idle time as passes are placed."""

    def __init__(self, forward: Sequence[float], inputs: Sequence[float], weights: Sequence[float], m: int,
                 limit: float, comm: Sequence[float], w_share: float = 1.0):
        p = len(forward)
        self.forward, self.inputs, self.weights, self.m, self.limit = forward, inputs, weights, m, limit
        self.w_share = w_share  # the share of a microbatch's activations its W holds after its I
        self.comm = comm  # comm[s]: a message's crossing between stage s and s + 1
        self.clock = [0.0] * p
        self.f_end = [[0.0] * m for _ in range(p)]
        self.i_end = [[0.0] * m for _ in range(p)]
        # when each pass's output has crossed to the stage that takes it: F to s + 1, I to s - 1
        self.f_sent = [[0.0] * m for _ in range(p)]
        self.i_sent = [[0.0] * m for _ in range(p)]
        self.out_free = [0.0] * p  # when stage s's outgoing link has sent everything given to it so far
        self.nf, self.ni, self.nw = [0] * p, [0] * p, [0] * p  # passes placed so far, by kind
        self.idle = [0.0] * p  # each stage's waits since its first F
        self.worst = 0.0  # the largest of them
        self.asked = set()  # the choices below ("hold", "short") this layout's outcome depended on
        self.orders: list[Order] = [[] for _ in range(p)]

    def held(self, nf: int, ni: int, nw: int) -> float:
        """Microbatches' activations stage s holds after nf Fs, ni Is and nw Ws."""
        return nf - ni * (1.0 - self.w_share) - nw * self.w_share

    def fits_f(self, nf: int, ni: int, nw: int) -> bool:
        """Whether one more F fits in memory after nf Fs, ni Is and nw Ws (with a margin for rounding)."""
        return self.held(nf + 1, ni, nw) <= self.limit + 1e-9

    def span(self) -> float:
        """The longest of the stages' spans, first pass's start to last pass's end."""
        return max(clock - (f_end[0] - f) for clock, f_end, f in zip(self.clock, self.f_end, self.forward))

    def arrival(self, s: int, kind: str) -> float:
        """When the input of stage s's next pass of this kind is there (0 if it needs none)."""
        last = len(self.forward) - 1
        if kind == "F":
            return self.f_sent[s - 1][self.nf[s]] if s else 0.0
        if kind == "I":
            return self.i_sent[s + 1][self.ni[s]] if s < last else self.f_end[s][self.ni[s]]
        return 0.0  # W: its I ran on this stage before it

    def put(self, s: int, kind: str) -> None:
        start = max(self.clock[s], self.arrival(s, kind))
        if self.nf[s] and start > self.clock[s]:
            self.idle[s] += start - self.clock[s]
            self.worst = max(self.worst, self.idle[s])
        if kind == "F":
            mb = self.nf[s]
            self.nf[s] += 1
            end = self.f_end[s][mb] = start + self.forward[s]
            if s + 1 < len(self.forward):
                self.f_sent[s][mb] = self.send(s, end, self.comm[s])
        elif kind == "I":
            mb = self.ni[s]
            self.ni[s] += 1
            end = self.i_end[s][mb] = start + self.inputs[s]
            if s:
                self.i_sent[s][mb] = self.send(s, end, self.comm[s - 1])
        else:
            mb = self.nw[s]
            self.nw[s] += 1
            end = start + self.weights[s]
        self.clock[s] = end
        self.orders[s].append((kind, mb))

    def send(self, s: int, end: float, crossing: float) -> float:
        """When the output of stage s's pass that ends at `end` has crossed (see the module): after the
        stage's earlier messages, one at a time over its outgoing link."""
        start = end if end > self.out_free[s] else self.out_free[s]
        self.out_free[s] = start + crossing
        return start + crossing

    def fill(self, s: int, kind: str, short_waits: bool) -> None:
        """Deferred Ws before stage s's next pass of `kind` (see the module): for memory, in the wait."""
        if kind == "F":
            while not self.fits_f(self.nf[s], self.ni[s], self.nw[s]):  # an I ran since the last F (module)
                self.put(s, "W")
        if (kind == "F" and s == 0) or (kind == "I" and s == len(self.forward) - 1):
            return  # its input is there as soon as the stage is free
        arrival, w = self.arrival(s, kind), self.weights[s]
        while self.nw[s] < self.ni[s] and self.clock[s] + w <= arrival:
            self.put(s, "W")
        if self.nw[s] < self.ni[s] and self.clock[s] < arrival:
            if self.idle[s] + arrival - self.clock[s] > self.worst:
                self.put(s, "W")
            else:
                self.asked.add("short")
                if short_waits:
                    self.put(s, "W")

    def warm_up(self, overrun: bool) -> list[int]:
        """Microbatch 0's F on every stage, the extra warm-up Fs (see the module), microbatch 0's I; returns
        each stage's number of extra Fs."""
        p, m = len(self.forward), self.m
        for s in range(p):
            self.put(s, "F")
        extra = [0] * p
        gradient = self.f_end[p - 1][0] + self.inputs[p - 1]  # when the last stage's I0 ends
        for s in range(p - 2, -1, -1):
            gradient += self.comm[s]  # when it reaches stage s
            clock = self.clock[s]
            while 1 + extra[s] < m and self.fits_f(1 + extra[s], 0, 0) and (clock < gradient if overrun
                                                          else clock + self.forward[s] <= gradient):
                clock += self.forward[s]
                extra[s] += 1
            gradient = max(clock, gradient) + self.inputs[s]
        for s in range(1, p):  # fewer than the stage before (unless taking every microbatch), never more
            cap = extra[s - 1] if 1 + extra[s] >= m else max(0, extra[s - 1] - 1)
            extra[s] = min(extra[s], cap)
        for s in range(p):
            for _ in range(extra[s]):
                self.put(s, "F")
        for s in range(p - 1, -1, -1):
            self.put(s, "I")
        return extra

    def one_f_one_b(self) -> None:
        """1F1B's order with each W right after its I (stage s: min(m, p - s) Fs, then I, W and F in turn),
        placed stage by stage as far as each pass's input allows."""
        p, m = len(self.forward), self.m
        left = [3 * m] * p
        while any(left):
            for s in range(p):
                while left[s]:
                    nf, ni, nw = self.nf[s], self.ni[s], self.nw[s]
                    if nw < ni:
                        kind = "W"
                    elif nf < m and nf < ni + min(m, p - s):
                        kind = "F"
                    else:
                        kind = "I"
                    if kind == "F" and s and self.nf[s - 1] <= nf or \
                            kind == "I" and (self.ni[s + 1] <= ni if s < p - 1 else nf <= ni):
                        break
                    self.put(s, kind)
                    left[s] -= 1

    def list_rule(self) -> None:
        """The event-driven list rule: whenever a stage is free it would run the first of an I whose input
        is there, the next F whose input is there (memory allowing), a deferred W; of every stage's choice
        the one that can start first runs (ties: I, then F, then W, then the lower stage). A pass changes
        the choices of its own stage and its two neighbours only, so only theirs are worked out again."""
        p, m, comm = len(self.forward), self.m, self.comm
        forward, inputs, weights, orders = self.forward, self.inputs, self.weights, self.orders
        clock, nf, ni, nw, f_end, i_end = self.clock, self.nf, self.ni, self.nw, self.f_end, self.i_end
        f_sent, i_sent = self.f_sent, self.i_sent
        none = (float("inf"), 3, p, "")

        def choice(s: int) -> tuple:
            best, i, f = none, ni[s], nf[s]
            if i < f and (s == p - 1 or i < ni[s + 1]):
                ready = f_end[s][i] if s == p - 1 else i_sent[s + 1][i]
                best = (clock[s] if clock[s] > ready else ready, 0, s, "I")
            if f < m and self.fits_f(f, i, nw[s]) and (s == 0 or f < nf[s - 1]):
                ready = f_sent[s - 1][f] if s else 0.0
                option = (clock[s] if clock[s] > ready else ready, 1, s, "F")
                best = option if option < best else best
            if nw[s] < i:
                option = (clock[s], 2, s, "W")
                best = option if option < best else best
            return best

        choices = [choice(s) for s in range(p)]
        for _ in range(3 * m * p):
            start, _, s, kind = min(choices)
            if kind == "F":
                mb = nf[s]
                nf[s] += 1
                clock[s] = f_end[s][mb] = start + forward[s]
                if s + 1 < p:
                    f_sent[s][mb] = self.send(s, clock[s], comm[s])
            elif kind == "I":
                mb = ni[s]
                ni[s] += 1
                clock[s] = i_end[s][mb] = start + inputs[s]
                if s:
                    i_sent[s][mb] = self.send(s, clock[s], comm[s - 1])
            else:
                mb = nw[s]
                nw[s] += 1
                clock[s] = start + weights[s]
            orders[s].append((kind, mb))
            choices[s] = choice(s)
            if s:
                choices[s - 1] = choice(s - 1)
            if s + 1 < p:
                choices[s + 1] = choice(s + 1)

    def holds_f(self, s: int) -> bool:
        """Whether stage s, two or more Fs ahead of stage s + 1, lets its next F wait for that stage's
        gradient: it skips the F if it is already past the time the gradient could come (stage s + 1's
        next F and I), or if the F (and the Ws memory needs first) would run past it and the wait left
        would not make the stage the worst."""
        nxt = s + 1
        comes = self.clock[nxt] + self.forward[nxt] + self.inputs[nxt] + self.comm[s]
        if self.clock[s] >= comes:
            return True
        freed, nf, ni = 0, self.nf[s], self.ni[s]  # the Ws memory needs before the F
        while not self.fits_f(nf, ni, self.nw[s] + freed):
            freed += 1
        if self.clock[s] + self.forward[s] + freed * self.weights[s] <= comes:
            return False
        return comes - self.clock[s] <= self.worst - self.idle[s]

    def steady(self, hold: bool, short_waits: bool) -> None:
        p, m = len(self.forward), self.m
        for mb in range(1, m):
            runs = [self.nf[s] < m for s in range(p)]
            for s in range(p - 1):
                if runs[s] and self.nf[s] >= self.nf[s + 1] + 2:
                    self.asked.add("hold")
                    runs[s] = not (hold and self.holds_f(s))
            for s in range(p - 2, -1, -1):
                runs[s] = runs[s] and runs[s + 1]
            for s in range(p):
                if runs[s]:
                    self.fill(s, "F", short_waits)
                    self.put(s, "F")
            for s in range(p - 1, -1, -1):
                if s == 0 and self.nf[0] == m:  # stage 0's I feeds no stage: its Ws need not wait
                    while self.nw[0] < self.ni[0]:
                        self.put(0, "W")
                else:
                    self.fill(s, "I", short_waits)
                self.put(s, "I")
        for s in range(p):
            while self.nw[s] < m:
                self.put(s, "W")


def _layouts(forward: Sequence[float], inputs: Sequence[float], weights: Sequence[float], m: int,
             limit: float, comm: Sequence[float], w_share: float) -> Iterator[_Layout]:
    """The heuristic's layouts, each set of choices once (one whose outcome does not depend on a choice
    is not laid out again the other way), then the list rule's, then 1F1B's if memory allows it."""
    plain = None  # the warm-up's counts without overrun
    for overrun in (False, True):
        asked_hold = False
        for hold in (True, False):
            if not (hold or asked_hold):
                break  # no stage was ever two Fs ahead: holding back changes nothing
            for short_waits in (True, False):
                layout = _Layout(forward, inputs, weights, m, limit, comm, w_share)
                extra = layout.warm_up(overrun)
                if overrun and extra == plain:
                    break  # the same warm-up: the same layouts again
                plain = plain if overrun else extra
                layout.steady(hold, short_waits)
                asked_hold = asked_hold or "hold" in layout.asked
                yield layout
                if "short" not in layout.asked:
                    break  # no short wait met: filling them or not changes nothing
    layout = _Layout(forward, inputs, weights, m, limit, comm, w_share)
    layout.list_rule()
    yield layout
    if limit >= min(m, len(forward)):
        layout = _Layout(forward, inputs, weights, m, limit, comm, w_share)
        layout.one_f_one_b()
        yield layout


def checked_options(w_share: object, objective: object) -> float:
    """`w_share` as a float in (0, 1] and `objective` one of "step" and "span", or one line saying which is not."""
    if objective not in ("step", "span"):
        raise ValueError(f"objective must be 'step' or 'span', got {objective!r}")
    if isinstance(w_share, bool) or not isinstance(w_share, (int, float)) or not 0 < w_share <= 1:
        raise ValueError(f"w_share must be a number in (0, 1], got {w_share!r}")
    return float(w_share)


def zb_orders(forward: Sequence[float], inputs: Sequence[float], weights: Sequence[float], microbatches: int,
              limit: float, *, comm: Sequence[float] | None = None, w_share: float = 1.0,
              objective: str = "step") -> list[Order]:
    """Each stage's passes by the heuristic above, from stage s's F, I and W durations (`forward[s]`,
    `inputs[s]`, `weights[s]`) with at most `limit` microbatches' activations held on any stage (a
    microbatch's are held until its W; with `w_share` r < 1, its I gives back all but r of them): of the
    heuristic's layouts, the list rule's and 1F1B's (with W right after I, when `limit` holds its
    min(m, p) microbatches on the first stage), the first with the earliest last pass (`objective="step"`)
    or with the shortest longest stage span (`"span"`: first pass's start to last pass's end, the
    reference's `best_time`, the period of back-to-back steps that overlap, as Zero Bubble's optimizer
    post-validation lets them). `comm[s]` (keyword, p - 1 entries, default all 0) is the seconds a message
    takes between stage s and s + 1, either way: every layout then counts it between a pass and the pass
    on the next stage that takes its output."""
    w_share = checked_options(w_share, objective)
    p = len(forward)
    if comm is None:
        comm = [0.0] * max(p - 1, 0)
    elif len(comm) != max(p - 1, 0) or not all(isinstance(c, (int, float)) and 0 <= c < float("inf")
                                                for c in comm):
        raise ValueError(f"comm must list {max(p - 1, 0)} crossing times (seconds >= 0, one per boundary "
                         f"between {p} stages), got {comm!r}")
    best, best_end = None, 0.0
    for layout in _layouts(forward, inputs, weights, microbatches, limit, comm, w_share):
        end = max(layout.clock) if objective == "step" else layout.span()
        if best is None or end < best_end:
            best, best_end = layout.orders, end
    return best
