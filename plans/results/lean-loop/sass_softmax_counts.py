"""Instruction counts of the softmax regions of each kernel's SASS: segments delimited by
barriers / MMA issue or wait / mbarrier waits, that contain MUFU.EX2."""
import re, sys, collections
DELIM = re.compile(r"\b(BAR\.SYNC|BAR\.RED|HGMMA\.64x256|WARPGROUP\.DEPBAR|SYNCS\.PHASECHK|BAR\.ARV)")
def kernels(path):
    fn, out = None, collections.defaultdict(list)
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m: fn = m.group(1); continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m and fn: out[fn].append(m.group(1).strip())
    return out
def segments(ins):
    seg = []
    for i in ins:
        if DELIM.search(i):
            if seg: yield seg
            seg = [i]
        else:
            seg.append(i)
    if seg: yield seg
def op(i):
    i = re.sub(r"^@!?U?P\w+\s+", "", i)
    return i.split()[0]
for path in sys.argv[1:]:
    print("==", path)
    for fn, ins in kernels(path).items():
        if "combine" in fn: continue
        short = fn.split("kdtree")[1][:40]
        for seg in segments(ins):
            ex = sum("MUFU.EX2" in i for i in seg)
            if ex == 0: continue
            c = collections.Counter(op(i).split(".")[0] for i in seg)
            top = ", ".join(f"{k} {v}" for k, v in c.most_common(9))
            print(f"  {short:40s} {seg[0][:28]:28s} {len(seg):5d} ins, EX2 {ex:3d} | {top}")
