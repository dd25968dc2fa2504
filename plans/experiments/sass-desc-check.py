"""Static check of a cuobjdump SASS listing: every memory descriptor operand desc[URn] (LDGSTS,
LDG, STG, ...) must have both registers of its pair, URn and URn+1, written somewhere in its
kernel. ptxas 13.0 miscompiles cache-hinted cp.async whose shared address has a warp-uniform part
into LDGSTS [Rx+UR0], desc[UR1] with UR0/UR1 never written, which traps on the device with
"an illegal instruction was encountered"; this catches it without a GPU.

    cuobjdump --dump-sass tree_verify_mla_sm_90a.o > k.sass
    python3 plans/experiments/sass-desc-check.py k.sass      # exit 1: an undefined descriptor
"""
import re, sys
text = open(sys.argv[1]).read()
funcs = re.split(r"\n\s*Function : ", text)[1:]
bad = 0
for f in funcs:
    name = f.split("\n", 1)[0].strip()
    body = [l for l in f.split("\n") if re.match(r"\s+/\*[0-9a-f]{4,}\*/", l)]
    written = set()
    for l in body:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s+(.*?);", l)
        if not m: continue
        op, args = m.groups()
        dst = args.split(",")[0].strip()
        d = re.fullmatch(r"UR(\d+)", dst)
        if d:
            n = int(d.group(1)); written.add(n)
            if ".64" in op or "WIDE" in op: written.add(n + 1)
    uses = {}
    for l in body:
        for n in re.findall(r"desc\[UR(\d+)\]", l):
            uses.setdefault(int(n), []).append(l.split(";")[0].strip())
    for n, ls in sorted(uses.items()):
        ok = n in written and (n + 1) in written
        if not ok:
            bad += 1
            print(f"{name[:60]}: desc[UR{n}] used {len(ls)}x, UR{n}/UR{n+1} never written; e.g. {ls[0]}")
print("UNDEFINED-DESC" if bad else "ok: every desc[URn] is written in its kernel")
sys.exit(1 if bad else 0)
