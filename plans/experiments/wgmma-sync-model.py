"""A model of the wgmma kernel's synchronisation (kernels/csrc/tree_verify_mla_sm90a.cuh) for main's
schedule (v6.3) and the experiments v7.0 (half-stage ring) and v7.1 (two P buffers, PV_b and the
next S_a issued behind): the producer and the two consumer warpgroups as sequences of mbarrier
waits (by parity) and arrivals, 256-thread named barriers, shared-memory reads and writes, and
wgmma groups whose reads last from issue to the wait that retires them. Random interleavings of
1..7 tiles with random "max moved" pairs are checked for deadlock, for a parity wait that could
pass on the wrong phase, and for any two conflicting accesses (one a write) not ordered by
happens-before (vector clocks through barriers). It models the code by hand: keep it in step.

    python3 plans/experiments/wgmma-sync-model.py v7.1 [seeds]
    python3 plans/experiments/wgmma-sync-model.py --self-check   # seeded bugs must be caught
"""
import random
import os
import sys
MUT = os.environ.get("MUT", "")

P, W0, W1 = 0, 1, 2


def vc_join(a, b):
    return [max(x, y) for x, y in zip(a, b)]


def vc_le(a, b):
    return all(x <= y for x, y in zip(a, b))


def producer(nt, ver):
    for it in range(nt):
        st = it % 2
        halves = ["L", "R"] if (st == 0 or ver == "v6.3") else ["R", "L"]
        if ver == "v6.3":
            if it >= 2:
                yield ("wait", ("E", st), (it // 2) - 1)
            yield ("w", ("K", st, "L"))
            yield ("w", ("K", st, "Rv"))
            yield ("w", ("K", st, "rope"))
            yield ("arrive", ("F", st))
            continue
        for h in halves:
            if it >= 2:
                yield ("wait", ("E", st, h), (it // 2) - 1)
            if h == "L":
                yield ("w", ("K", st, "L"))
            else:
                yield ("w", ("K", st, "Rv"))
                yield ("w", ("K", st, "rope"))
            yield ("arrive", ("F", st, h))


def qk(st, ph, r_first, ver):
    if ver == "v6.3":
        yield ("wait", ("F", st), ph)
        yield ("ar", ("K", st, "L"))
        yield ("ar", ("K", st, "Rv"))
        yield ("ar", ("K", st, "rope"))
    else:
        order = ["R", "L"] if r_first else ["L", "R"]
        for h in order:
            yield ("wait", ("F", st, h), ph)
            if h == "L":
                yield ("ar", ("K", st, "L"))
            else:
                yield ("ar", ("K", st, "Rv"))
                yield ("ar", ("K", st, "rope"))
    yield ("commit",)


def epilogue(me):
    yield ("wgwait", 0)
    yield ("bar", "E")
    if me == W1:
        yield ("w", "sA")
    yield ("bar", "E")
    if me == W0:
        yield ("r", "sA")
        yield ("w", "sL")
    yield ("bar", "E")
    yield ("r", "sM")
    yield ("r", "sL")


def wg0(nt, moved, ver):
    npairs = (nt + 1) // 2
    E = (lambda st, h: ("E", st)) if ver == "v6.3" else (lambda st, h: ("E", st, h))
    if ver == "v7.1" and npairs > 0:
        yield from qk(0, 0, False, ver)
    for i in range(npairs):
        has_b = 2 * i + 1 < nt
        if ver != "v7.1":
            yield from qk(0, i, False, ver)
        yield ("wgwait", 0)
        if i > 0:
            yield ("r", "sM")
        if ver == "v7.1" and MUT == "early_arrive":
            yield ("arrive", E(0, "R"))
            yield ("w", ("K", 0, "rope"))
        elif ver == "v7.1":
            yield ("w", ("K", 0, "rope"))
            yield ("arrive", E(0, "R"))
        else:
            yield ("w", "P")
        yield ("w", "sM")
        yield ("w", "sA")
        yield ("ar", ("K", 0, "L"))
        yield ("commit",)
        yield ("bar", "MA")
        if ver != "v7.1":
            if has_b:
                yield ("bar", "SB")
                yield ("r", "sL")
            yield ("wgwait", 0)
            yield ("arrive", E(0, "L"))
            if has_b:
                yield ("bar", "PB")
                yield ("ar", "P")
                yield ("ar", ("K", 1, "L"))
                yield ("commit",)
                yield ("wgwait", 0)
                yield ("arrive", E(1, "L"))
            continue
        if not has_b:
            yield ("wgwait", 0)
            yield ("arrive", E(0, "L"))
            break
        if MUT == "flags_early":
            yield ("r", "flags")
        yield ("bar", "SB")
        yield ("r", "sL")
        yield ("r", "flags")
        if moved[i]:
            yield ("wgwait", 0)
            yield ("arrive", E(0, "L"))
            yield ("ar", "P")
            yield ("ar", ("K", 1, "L"))
            yield ("commit",)
        else:
            yield ("ar", "P")
            yield ("ar", ("K", 1, "L"))
            yield ("commit",)
            yield ("wgwait", 1)
            yield ("arrive", E(0, "L"))
        if i + 1 < npairs:
            yield ("wait", ("F", 0, "L"), i + 1)
            yield ("ar", ("K", 0, "L"))
            yield ("commit",)
            yield ("wgwait", 2 if MUT == "depth2" else 1)
            yield ("arrive", E(1, "L"))
            yield ("wait", ("F", 0, "R"), i + 1)
            yield ("ar", ("K", 0, "Rv"))
            yield ("ar", ("K", 0, "rope"))
            yield ("commit",)
        else:
            yield ("wgwait", 0)
            yield ("arrive", E(1, "L"))
    yield from epilogue(W0)


def wg1(nt, moved, ver):
    npairs = (nt + 1) // 2
    E = (lambda st, h: ("E", st)) if ver == "v6.3" else (lambda st, h: ("E", st, h))
    F = (lambda st, h: ("F", st)) if ver == "v6.3" else (lambda st, h: ("F", st, h))
    pa_region = ("K", 0, "rope") if ver == "v7.1" else "P"
    for i in range(npairs):
        has_b = 2 * i + 1 < nt
        if has_b:
            yield from qk(1, i, True, ver)
        if MUT == "pb_early" and has_b:
            yield ("w", "P")
        yield ("bar", "MA")
        yield ("r", "sM")
        yield ("r", "sA")
        if ver == "v6.3":
            yield ("wait", F(0, None), i)
        else:
            yield ("wait", F(0, "L"), i)
            yield ("wait", F(0, "R"), i)
        yield ("wgwait", 0)
        if has_b:
            yield ("w", "sM")
            yield ("w", "sL")
            if ver == "v7.1":
                yield ("w", "flags")
        yield ("ar", ("K", 0, "Rv"))
        yield ("ar", pa_region)
        yield ("commit",)
        if ver != "v7.1":
            if has_b:
                yield ("bar", "SB")
            yield ("wgwait", 0)
            yield ("arrive", E(0, "R"))
            if has_b:
                yield ("w", "P")
                yield ("ar", ("K", 1, "Rv"))
                yield ("commit",)
                yield ("bar", "PB")
                yield ("wgwait", 0)
                yield ("arrive", E(1, "R"))
            continue
        if not has_b:
            yield ("wgwait", 0)
            yield ("arrive", E(0, "R"))
            break
        if MUT != "pb_late":
            yield ("w", "P")
        yield ("bar", "SB")
        if MUT == "pb_late":
            yield ("w", "P")
        yield ("r", "flags")
        if moved[i]:
            yield ("wgwait", 0)
            yield ("arrive", E(0, "R"))
            yield ("ar", ("K", 1, "Rv"))
            yield ("commit",)
        else:
            yield ("ar", ("K", 1, "Rv"))
            yield ("commit",)
            yield ("wgwait", 1)
            yield ("arrive", E(0, "R"))
        yield ("wgwait", 0)
        yield ("arrive", E(1, "R"))
    yield from epilogue(W1)


def expected(bar, ver):
    if bar[0] == "F":
        return 1
    if ver == "v6.3":
        return 2
    if ver == "v7.1" and bar == ("E", 0, "R"):
        return 1 if MUT == "count1" else 2
    return 1


def run(nt, moved, ver, rng):
    gens = [producer(nt, ver), wg0(nt, moved, ver), wg1(nt, moved, ver)]
    pending = [None, None, None]
    done = [False] * 3
    vc = [[0, 0, 0] for _ in range(3)]
    bars = {}  # name -> [completed phases, arrivals this phase, vc accum, [vc per completed phase]]
    named = {}  # id -> list of (generation arrivals)
    named_count = {W0: {}, W1: {}}
    groups = {W0: [], W1: []}  # outstanding committed groups: list of list of (region, vc at issue)
    open_group = {W0: [], W1: []}
    accesses = {}  # region -> list of (actor, kind, vc)
    errors = []

    def tick(a):
        vc[a][a] += 1

    def access(a, region, kind, v):
        for (b, k2, v2) in accesses.get(region, []):
            if b == a and kind != "async_issue":
                continue
            if kind == "r" and k2 in ("r", "ar"):
                continue
            if kind == "ar" and k2 in ("r", "ar"):
                continue
            if not vc_le(v2, v):
                errors.append(f"race on {region}: {['P','W0','W1'][b]} {k2} vs {['P','W0','W1'][a]} {kind}")
        if kind == "w":
            for b in (W0, W1):
                for g in groups[b] + [open_group[b]]:
                    for (reg, _) in g:
                        if reg == region:
                            errors.append(f"write to {region} by {['P','W0','W1'][a]} while an MMA of {['P','W0','W1'][b]} reads it")
        accesses.setdefault(region, []).append((a, kind, list(v)))

    def retire(a, keep):
        while len(groups[a]) > keep:
            g = groups[a].pop(0)
            for (reg, _) in g:
                access(a, reg, "ar", vc[a])

    steps = 0
    while not all(done):
        steps += 1
        if steps > 100000:
            errors.append("livelock")
            break
        runnable = []
        for a in range(3):
            if done[a]:
                continue
            if pending[a] is None:
                try:
                    pending[a] = next(gens[a])
                except StopIteration:
                    done[a] = True
                    continue
            op = pending[a]
            if op[0] == "wait":
                st = bars.get(op[1], [0, 0, [0, 0, 0], []])
                n, k = st[0], op[2]
                # parity wait for phase k passes when phase k has completed, i.e. n >= k + 1;
                # with parity semantics it passes whenever (n & 1) != (k & 1)
                passes_parity = (n & 1) != (k & 1)
                if passes_parity and n != k + 1:
                    errors.append(f"parity wait on {op[1]} for phase {k} passes at {n} completed phases")
                if passes_parity:
                    runnable.append(a)
            elif op[0] == "barwait":
                if len(named[op[1]]) == 2:
                    runnable.append(a)
            else:
                runnable.append(a)
        if all(done):
            break
        if not runnable:
            errors.append(f"deadlock: {pending}")
            break
        a = rng.choice(runnable)
        op = pending[a]
        pending[a] = None
        tick(a)
        kind = op[0]
        if kind == "wait":
            st = bars[op[1]]
            vc[a] = vc_join(vc[a], st[3][op[2]])
        elif kind == "arrive":
            st = bars.setdefault(op[1], [0, 0, [0, 0, 0], []])
            st[1] += 1
            st[2] = vc_join(st[2], vc[a])
            if st[1] > expected(op[1], ver):
                errors.append(f"overarrival on {op[1]}")
            if st[1] == expected(op[1], ver):
                st[3].append(st[2])
                st[0] += 1
                st[1] = 0
                st[2] = [0, 0, 0]
        elif kind == "bar":
            gen = named_count[a].get(op[1], 0)
            key = (op[1], gen)
            named.setdefault(key, []).append((a, list(vc[a])))
            named_count[a][op[1]] = gen + 1
            pending[a] = ("barwait", key)
        elif kind == "barwait":
            j = vc_join(named[op[1]][0][1], named[op[1]][1][1])
            vc[a] = vc_join(vc[a], j)
        elif kind in ("r", "w"):
            access(a, op[1], kind, vc[a])
        elif kind == "ar":
            access(a, op[1], "r", vc[a])
            open_group[a].append((op[1], list(vc[a])))
        elif kind == "commit":
            groups[a].append(open_group[a])
            open_group[a] = []
        elif kind == "wgwait":
            retire(a, op[1])
    return errors


def self_check():
    global MUT
    caught = {}
    for m in ("count1", "depth2", "flags_early", "pb_late"):
        MUT = m
        errs = set()
        for nt in range(1, 8):
            for s in range(40):
                rng = random.Random(s * 31 + nt)
                moved = [rng.random() < 0.4 for _ in range((nt + 1) // 2)]
                errs |= set(run(nt, moved, "v7.1", rng))
        caught[m] = len(errs)
        print(f"seeded bug {m}: {len(errs)} distinct errors")
    MUT = ""
    assert all(caught.values()), caught


def main():
    if sys.argv[1] == "--self-check":
        self_check()
        return
    ver = sys.argv[1]
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    found = {}
    for nt in range(1, 8):
        for s in range(seeds):
            rng = random.Random(s * 31 + nt)
            npairs = (nt + 1) // 2
            moved = [rng.random() < 0.4 for _ in range(npairs)]
            for e in run(nt, moved, ver, rng):
                found.setdefault(e, (nt, s))
    for e, w in sorted(found.items()):
        print(ver, "ERROR", e, "first at tiles/seed", w)
    print(ver, "errors:", len(found))


if __name__ == "__main__":
    main()
