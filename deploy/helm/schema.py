"""Write the `config` part of the chart's values.schema.json from the settings' own model.

The chart's values are checked at `helm install` by helm/online-rl/values.schema.json. Its
`config` subtree is the online-rl configuration (online_rl/config.py); its JSON schema is generated
here from the pydantic models, so that a wrong type, an unknown choice or a misspelt field fails at
install with the field named, and never drifts from what the code reads. The rest of the schema
(images, Kafka, MLflow, resources...) is written by hand in that file.

    .venv/bin/python deploy/helm/schema.py          # rewrite the file
    .venv/bin/python deploy/helm/schema.py --check  # exit 1 when it is out of date (the tests do this)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from online_rl.config import Settings

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "helm" / "online-rl" / "values.schema.json"
_DROP = {"title", "format", "writeOnly"}  # Helm's validator needs none; "path" is no JSON-schema format


def _tidy(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _tidy(v) for k, v in node.items() if k not in _DROP}
        if "properties" in out and out.get("type") == "object":
            out["additionalProperties"] = False  # a misspelt setting fails at install, not silently
        return out
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node


def config_defs() -> dict[str, Any]:
    """The JSON schemas of the settings' models, `Settings` (the whole tree) among them."""
    schema = Settings.model_json_schema(mode="validation", ref_template="#/$defs/{model}")
    defs = {name: _tidy(body) for name, body in schema.pop("$defs", {}).items()}
    defs["Settings"] = _tidy(schema)
    return dict(sorted(defs.items()))


def render(current: dict[str, Any]) -> dict[str, Any]:
    """`current` with its `$defs` regenerated (the hand-written part is kept as it is)."""
    return {**current, "$defs": config_defs()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Only say whether the file is up to date.")
    args = parser.parse_args()
    current = json.loads(SCHEMA_FILE.read_text())
    text = json.dumps(render(current), indent=2) + "\n"
    if args.check:
        if text != SCHEMA_FILE.read_text():
            print(f"{SCHEMA_FILE} is out of date: run .venv/bin/python deploy/helm/schema.py",
                  file=sys.stderr)
            return 1
        return 0
    SCHEMA_FILE.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
