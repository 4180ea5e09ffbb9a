"""`make demo`, N times: `turnkeeper run "What is 17 * 23? Use the calculator."` on the
embedded default model, each run with another seed (`--seed`), counting the runs that
end with an answer holding 391 and exit code 0.

    python bench/demo.py              # 10 runs, seeds 1..10
    python bench/demo.py -n 20 --first-seed 100

Each run is its own process, as `make demo` is (the model loads each time). Prints one
line per run (seed, exit code, seconds, how it ended, the answer) and then the count.
Figures, not assertions.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

PROMPT = "What is 17 * 23? Use the calculator."
EXPECTED = re.compile(r"(?<![\d.])391(?![\d])")
_ENDED = re.compile(r"^(answered after .*|halted by .*)$", re.MULTILINE)


def run_once(seed: int) -> tuple[int, float, str, str]:
    """Exit code, seconds, how the run ended (the guard's line, if any) and the answer."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "turnkeeper.cli", "run", "--seed", str(seed), PROMPT],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    ended = _ENDED.findall(done.stderr)
    return done.returncode, seconds, ended[-1] if ended else "answered", done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10, help="runs (default 10)")
    parser.add_argument("--first-seed", type=int, default=1, help="seed of the first run")
    options = parser.parse_args()
    good = 0
    for seed in range(options.first_seed, options.first_seed + options.n):
        code, seconds, ended, answer = run_once(seed)
        right = code == 0 and EXPECTED.search(answer) is not None
        good += right
        flat = " ".join(answer.split())[:100]
        print(
            f"seed {seed:>4}: exit {code}  {seconds:5.1f} s  {'right' if right else 'WRONG'}  "
            f"{ended[:60]}  | {flat}",
            flush=True,
        )
    print(f"{good}/{options.n} runs answered with 391 and exit 0 (target: at least 9/10)")


if __name__ == "__main__":
    main()
