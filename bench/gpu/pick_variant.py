"""Pick the fastest blocked-kernel variant of a run-h100.sh DVARIANTS sweep (aatrox compression
plus decompression end-to-end GB/s on grf512 noa:1e-3) and print the shell assignments that select
it for the full bench:  eval "$(python3 pick_variant.py $OUT)"."""
import glob, json, os, re, sys

best = None
for path in glob.glob(os.path.join(sys.argv[1], "d-*.json")):
    recs = [r for r in json.load(open(path)) if r["codec"] == "aatrox" and r["bit_identical_to_cpu"]]
    if not recs:
        continue
    r = recs[0]
    score = 1.0 / (1.0 / r["compress_gbps"] + 1.0 / r["decompress_gbps"])  # round-trip rate
    m = re.match(r"d-(.*?)(?:-w(\d+)_(\d+))?\.json$", os.path.basename(path))
    defines = "" if m.group(1) == "default" else m.group(1).replace("_1", "=1").replace("_0", "=0")
    print(f"# {os.path.basename(path)}: compress {r['compress_gbps']:.1f} decompress {r['decompress_gbps']:.1f} GB/s", file=sys.stderr)
    if best is None or score > best[0]:
        best = (score, defines, m.group(2) or "", m.group(3) or "", os.path.basename(path))
if best:
    print(f"# picked {best[4]}", file=sys.stderr)
    print(f'export FULL_DEFINES="{best[1]}" ZCOMM_GPU_WARPS={best[2]} ZCOMM_GPU_MINB={best[3]}')
