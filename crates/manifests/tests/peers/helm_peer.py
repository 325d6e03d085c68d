"""Real peers for the chart tests: Helm v4's engine (PyPI helm-python-sdk, libhelm_c.so)
and the upstream OpenAPI schemas (PyPI kubernetes-validate).

Reads one JSON request on stdin and writes one JSON answer on stdout:

  request: {"chart": DIR, "cases": [CASE...], "parse_sets": [[[KIND, EXPR]...]...]}
  CASE:    {"name", "namespace", "kube_version": "v1.33.0", "api_versions": [...],
            "values": {...}, "lint": bool, "validate": bool}
  answer:  {"helm_sdk_version", "validator_versions": [...], "parsed_sets": [...],
            "cases": [{"name", "error"?, "merged_values", "manifests": {path: text},
                       "lint": {...}, "validation": [{"object", "version", "error"}],
                       "not_validated": [kind...]}]}

Exits 3 with a one-line message when a peer is missing, so the Rust test can say what to
install. Nothing here decides whether the chart is right; the Rust tests do.
"""

import json
import sys

try:
    import helm_python as helm
    from helm_python import _native
except ImportError as e:  # pragma: no cover
    print(f"helm-python-sdk is not installed ({e}): pip install helm-python-sdk", file=sys.stderr)
    sys.exit(3)
try:
    import jsonschema
    import kubernetes_validate
    import referencing
    import yaml
    from kubernetes_validate import utils as kv
except ImportError as e:  # pragma: no cover
    print(f"kubernetes-validate is not installed ({e}): pip install kubernetes-validate", file=sys.stderr)
    sys.exit(3)


def schema_versions():
    """Every Kubernetes minor version kubernetes-validate ships schemas for."""
    return kv.all_versions()


_validators = {}


def validator(version, kind, api_version):
    """A strict Draft 2020-12 validator for kind at version (cached: loading the
    definitions is what takes time, not validating)."""
    key = (version, kind, api_version)
    if key in _validators:
        return _validators[key]
    import re

    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    base = f"kubernetes-json-schema/v{version}-local-strict"
    try:
        schema = kv.schema_contents(f"{base}/{kind.lower()}-{group}.json", version)
    except FileNotFoundError:
        _validators[key] = None
        return None
    defs_key = ("defs", version)
    if defs_key not in _validators:
        _validators[defs_key] = referencing.Resource.from_contents(
            kv.schema_contents(f"{base}/_definitions.json", version)
        )
    registry = referencing.Resource.from_contents(schema) @ referencing.Registry()
    registry = _validators[defs_key] @ registry
    v = jsonschema.validators.Draft202012Validator(schema, registry=registry)
    _validators[key] = v
    return v


def schema_dir_version(kube_version):
    """The newest shipped schema version not newer than kube_version (as the package does)."""
    want = tuple(int(x) for x in kv.major_minor(kube_version.lstrip("v")).split("."))
    shipped = [v for v in schema_versions() if tuple(int(x) for x in v.split(".")[:2]) <= want]
    if not shipped:
        raise SystemExit(f"kubernetes-validate ships no schema for {kube_version}")
    return shipped[-1]


def run_case(chart, case):
    out = {"name": case["name"]}
    values = case.get("values") or {}
    opts = {
        "name": case.get("release", "hami-rs"),
        "namespace": case["namespace"],
        "kube_version": case["kube_version"],
        "api_versions": case.get("api_versions", []),
        "is_install": True,
    }
    try:
        out["merged_values"] = chart.merge_values(values)
        chart.validate_schema(out["merged_values"])
        rendered = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
        out["manifests"] = json.loads(rendered)
    except helm.HelmError as e:
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    if case.get("lint"):
        out["lint"] = helm.lint(
            case["chart_dir"],
            values,
            strict=True,
            namespace=case["namespace"],
            kube_version=case["kube_version"],
        )
    if case.get("validate"):
        version = schema_dir_version(case["kube_version"])
        out["schema_version"] = version
        problems, skipped = [], set()
        for path, text in sorted(out["manifests"].items()):
            if not path.endswith((".yaml", ".yml")):
                continue  # NOTES.txt
            for doc in yaml.safe_load_all(text):
                if doc is None:
                    continue
                if not isinstance(doc, dict):
                    problems.append({"object": path, "version": version, "error": "not an object"})
                    continue
                what = f'{path}: {doc.get("kind")} {doc.get("metadata", {}).get("name")}'
                v = validator(version, doc.get("kind", ""), doc.get("apiVersion", ""))
                if v is None:
                    skipped.add(f'{doc.get("apiVersion")}/{doc.get("kind")}')
                    continue
                for err in v.iter_errors(doc):
                    loc = "/".join(str(p) for p in err.absolute_path)
                    problems.append({"object": what, "version": version, "error": f"{loc}: {err.message}"})
        out["validation"] = problems
        out["not_validated"] = sorted(skipped)
    return out


def main():
    req = json.load(sys.stdin)
    chart = helm.Chart.load(req["chart"])
    answer = {
        "helm_sdk_version": helm.helm_sdk_version(),
        "validator_versions": [v for v in schema_versions()],
        # [kind, expression] pairs: --set is typed (true is a bool), --set-string is not.
        "parsed_sets": [
            [
                helm.parse_set_string_values(expr) if kind == "set-string" else helm.parse_set_string(expr)
                for kind, expr in exprs
            ]
            for exprs in req.get("parse_sets", [])
        ],
        "cases": [],
    }
    for case in req.get("cases", []):
        case.setdefault("chart_dir", req["chart"])
        answer["cases"].append(run_case(chart, case))
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
