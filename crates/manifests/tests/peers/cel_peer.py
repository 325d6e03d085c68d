"""A real CEL implementation (PyPI cel-python) for the webhook's matchConditions.

stdin: {"conditions": [expr...], "bindings": [{"object": ..., "oldObject": ..., "request": ...}]}
stdout: one entry per binding: true when every condition is true (the API server calls the
webhook only then), false when one is false, or "error: ..." when one fails to evaluate.
Exits 3 with what to install when cel-python is missing.
"""

import json
import sys

try:
    import celpy
except ImportError as e:  # pragma: no cover
    print(f"cel-python is not installed ({e}): pip install cel-python", file=sys.stderr)
    sys.exit(3)


def main():
    req = json.load(sys.stdin)
    env = celpy.Environment()
    programs = [env.program(env.compile(c)) for c in req["conditions"]]
    out = []
    for b in req["bindings"]:
        activation = {k: celpy.json_to_cel(v) for k, v in b.items()}
        verdict = True
        for p in programs:
            try:
                r = p.evaluate(activation)
            except Exception as e:  # an evaluation error: the API server applies failurePolicy
                verdict = f"error: {e}"
                break
            if isinstance(r, Exception):
                verdict = f"error: {r}"
                break
            if not bool(r):
                verdict = False
                break
        out.append(verdict)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
