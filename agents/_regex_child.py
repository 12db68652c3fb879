"""The child process of bounded_search.py: reads `[pattern, flags, text, timeout_s]` lines and
answers each with a line "1" (a match somewhere) or "0", after a first line "ready".

Run by path under `python -I`; its argument is the folder regress is installed in. Before each
search it sets its CPU-time limit a little past the request's timeout: the parent stops a slow
search by killing this process, and if the parent itself dies mid-search (killed, so no atexit
runs) the kernel ends this process rather than leaving it spinning.
"""

import json
import resource
import sys

CACHED_PATTERNS = 256


def _limit_cpu(seconds: float) -> None:
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + seconds) + 2
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def main() -> None:
    sys.path.append(sys.argv[1])
    import regress

    compiled: dict[tuple[str, str], regress.Regex] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        pattern, flags, text, timeout_s = json.loads(line)
        regex = compiled.get((pattern, flags))
        if regex is None:
            if len(compiled) >= CACHED_PATTERNS:
                compiled.clear()
            regex = compiled[pattern, flags] = regress.Regex(pattern, flags)
        _limit_cpu(timeout_s)
        sys.stdout.write("1\n" if regex.find(text) is not None else "0\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
