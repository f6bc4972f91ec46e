#!/usr/bin/env python3
"""Writes every PromQL query of dashboard.json as a recording rule to the file named by the
first argument, so that `promtool check rules` parses them (CI: .ci/run). Grafana's variables
become what Prometheus would see: `$__rate_interval` a range, `$job` a regex."""
import json
import pathlib
import sys

here = pathlib.Path(__file__).parent
dashboard = json.loads((here / "dashboard.json").read_text())


def queries(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


rules = []
for i, query in enumerate(queries(dashboard)):
    if query.startswith("label_values("):
        # Grafana's own function: its first argument is the metric.
        query = query[len("label_values("):].split(",")[0]
    query = query.replace("$__rate_interval", "5m").replace("$job", ".*")
    rules.append({"record": f"dashboard:query:{i}", "expr": query})
if not rules:
    sys.exit("no query found in dashboard.json")
pathlib.Path(sys.argv[1]).write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
print(f"{len(rules)} dashboard queries")
