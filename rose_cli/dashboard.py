"""``rose dashboard generate|check|preview``: the Grafana dashboard written as code.

``generate`` builds the dashboard of :mod:`rose_cli.dashboard_spec` with the Grafana Foundation
SDK (``grafana-foundation-sdk``, the ``dashboard`` extra) and writes its JSON; ``check`` exits 1
when the committed JSON differs from what ``generate`` would write; ``preview`` renders every
panel's queries, fetched from a Prometheus, to a PNG with matplotlib: a preview of the panels,
not Grafana (Grafana's server cannot run here).

I/O boundary: the JSON file, HTTP range queries to ``--prometheus-url`` (``preview``), the PNG.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from rose_cli import dashboard_spec as spec
from rose_common.cli import EnvArgumentParser, duration

DASHBOARD_JSON = Path(__file__).resolve().parents[1] / "manifests" / "grafana" / "slo-vs-rl-throughput.json"
GRID_WIDTH = 24
PANEL_HEIGHT = 8


def _variables() -> list[Any]:
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh

    ds = db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    out: list[Any] = [ds]
    for v in spec.VARIABLES:
        current = VariableOption(text=v.default, value=v.default)
        if v.kind == "query":
            all_ = VariableOption(text="All", value="$__all")
            out.append(
                db.QueryVariable(v.name)
                .label(v.label)
                .description(v.description)
                .datasource(DataSourceRef(type_val="prometheus", uid="${datasource}"))
                .query(v.choices)
                .include_all(True)
                .multi(True)
                .current(all_)
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            )
        elif v.kind == "custom":
            out.append(
                db.CustomVariable(v.name).label(v.label).description(v.description).values(v.choices).current(current)
            )
        else:
            out.append(
                db.TextBoxVariable(v.name)
                .label(v.label)
                .description(v.description)
                .default_value(v.default)
                .current(current)
            )
    return out


def _panel(p: spec.Panel) -> Any:
    from grafana_foundation_sdk.builders import common, prometheus, timeseries
    from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement, SortOrder, TooltipDisplayMode
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    legend = common.VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
    tooltip = common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)
    b = (
        timeseries.Panel()
        .title(p.title)
        .description(p.description)
        .unit(p.unit)
        .datasource(DataSourceRef(type_val="prometheus", uid="${datasource}"))
        .span(p.width)
        .height(PANEL_HEIGHT)
        .legend(legend.placement(LegendPlacement.BOTTOM))
        .tooltip(tooltip)
    )
    for i, t in enumerate(p.targets):
        b = b.with_target(prometheus.Dataquery().expr(t.expr).legend_format(t.legend).ref_id(chr(ord("A") + i)).range())
    return b


def build() -> dict[str, Any]:
    """The dashboard JSON (a dict), built with the Grafana Foundation SDK's types."""
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    d = db.Dashboard(spec.TITLE).uid(spec.UID).description(spec.DESCRIPTION).tags(["rose"])
    d = d.timezone("utc").time("now-6h", "now").refresh("30s").editable()
    for v in _variables():
        d = d.with_variable(v)
    for row in spec.ROWS:
        d = d.with_row(db.Row(row.title))
        for p in row.panels:
            d = d.with_panel(_panel(p))
    out: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------- preview


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """One Prometheus range query; raises ``RuntimeError`` with Prometheus' error text."""
    import urllib.parse
    import urllib.request

    qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{qs}", timeout=30) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error', body)}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's ``{{label}}`` legend substitution."""
    out = spec.interpolate(template)
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def fetch_all(url: str, window_s: float, end: float | None = None) -> dict[str, list[tuple[str, list[dict[str, Any]]]]]:
    """Every panel's targets (interpolated with the variables' defaults) as range-query results."""
    end = time.time() if end is None else end
    start, step = end - window_s, max(1.0, window_s / 200)
    return {
        p.title: [(t.legend, query_range(url, spec.interpolate(t.expr), start, end, step)) for t in p.targets]
        for p in spec.PANELS
    }


def plot(data: dict[str, list[tuple[str, list[dict[str, Any]]]]], out: Path, note: str) -> None:
    """One subplot per panel, laid out like the dashboard's grid, to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[list[spec.Panel]] = []
    for row in spec.ROWS:
        line: list[spec.Panel] = []
        for p in row.panels:
            if sum(q.width for q in line) + p.width > GRID_WIDTH:
                rows.append(line)
                line = []
            line.append(p)
        rows.append(line)
    starts = [pts[0][0] for targets in data.values() for _, res in targets for s in res if (pts := _finite(s))]
    t0 = min(starts, default=0.0)
    fig = plt.figure(figsize=(20, 3.2 * len(rows) + 1))
    grid = fig.add_gridspec(len(rows), GRID_WIDTH)
    for r, line in enumerate(rows):
        x = 0
        for p in line:
            ax = fig.add_subplot(grid[r, x : x + p.width])
            x += p.width
            _draw(ax, p, data.get(p.title, []), t0)
    fig.suptitle(f"{spec.TITLE}: PREVIEW rendered with matplotlib, not Grafana. {note}", fontsize=12)
    with warnings.catch_warnings():  # crowded rows (long legends): matplotlib keeps its default layout
        warnings.filterwarnings("ignore", message="Tight layout not applied", category=UserWarning)
        fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=70)
    plt.close(fig)


def _draw(ax: Any, p: spec.Panel, series: list[tuple[str, list[dict[str, Any]]]], t0: float) -> None:
    for template, result in series:
        for s in result:
            pts = _finite(s)
            if pts:
                ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], label=legend(template, s["metric"])[:48])
    ax.set_title(p.title, fontsize=9)
    ax.set_xlabel("seconds", fontsize=7)
    ax.set_ylabel(p.unit, fontsize=7)
    ax.tick_params(labelsize=7)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _finite(series: dict[str, Any]) -> list[tuple[float, float]]:
    """A range-query series' points, without NaN / Inf (what a graph can draw)."""
    pts = [(float(t), float(v)) for t, v in series["values"]]
    return [(t, v) for t, v in pts if math.isfinite(v)]


def empty_panels(data: dict[str, list[tuple[str, list[dict[str, Any]]]]]) -> list[str]:
    """Titles of panels none of whose targets returned a finite value."""
    return [title for title, targets in data.items() if not any(_finite(s) for _, res in targets for s in res)]


# ---------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = EnvArgumentParser(env_prefix="ROSE_DASHBOARD_", prog="rose dashboard", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write the dashboard JSON")
    g.flag("--out", type=Path, default=DASHBOARD_JSON, help="where to write it")
    c = sub.add_parser("check", help="exit 1 if the committed JSON is not what generate writes")
    c.flag("--file", type=Path, default=DASHBOARD_JSON, help="the committed JSON")
    v = sub.add_parser("preview", help="render the panels from a Prometheus to a PNG (a preview, not Grafana)")
    v.flag("--prometheus-url", default="http://127.0.0.1:9090", help="Prometheus base URL")
    v.flag("--window", type=duration, default=600.0, help="time range shown, ending now (e.g. 10m)")
    v.flag("--out", type=Path, default=Path("docs/dashboard-preview.png"), help="the PNG to write")
    v.flag("--note", default="", help="a line added to the title (e.g. what scenario ran)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "generate":
        args.out.write_text(render())
        print(f"wrote {args.out}")
        return 0
    if args.cmd == "check":
        if args.file.read_text() != render():
            print(
                f"rose dashboard: {args.file} is not what the generator writes: run `rose dashboard generate`",
                file=sys.stderr,
            )
            return 1
        return 0
    data = fetch_all(args.prometheus_url, args.window)
    plot(data, args.out, args.note)
    empty = empty_panels(data)
    print(f"wrote {args.out}: {len(data) - len(empty)}/{len(data)} panels with data")
    for title in empty:
        print(f"  no data: {title}", file=sys.stderr)
    return 0
