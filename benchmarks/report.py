"""Turning benchmark results into markdown: the figures, the ratios, the targets."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.config import Results

SYSTEMS = ["shmbuf", "shmbuf-lf", "shmbuf-py", "cpprb", "torchrl", "sb3", "naive", "numpy"]
METRICS = [  # (key, what, unit)
    ("add 1w x1", "add, 1 writer, 1 row per call", "rows/s"),
    ("add 1w x64", "add, 1 writer, 64 rows per call", "rows/s"),
    ("add 2w x1", "add, 2 writers, 1 row per call", "rows/s"),
    ("add 2w x64", "add, 2 writers, 64 rows per call", "rows/s"),
    ("sample", "sample 256, no writer: default call (a new batch each call)", "batches/s"),
    ("sample GB/s", "sample 256, no writer: default call", "GB/s"),
    ("sample out=", "sample 256, no writer: out= (one batch refilled)", "batches/s"),
    ("sample out= GB/s", "sample 256, no writer: out=", "GB/s"),
    ("sample +1w", "sample 256 (default call), 1 writer adding x64", "batches/s"),
    ("writer during sample", "that writer meanwhile", "rows/s"),
    ("e2e ingest", "end to end (2 writers x64 + learner): ingest", "rows/s"),
    ("e2e batches", "end to end: batches sampled (default call)", "batches/s"),
]

SPREAD_MARK = 10.0
"""Percent: a figure whose repeats spread wider than this ((max - min) / median) is
marked in bold, and listed under the tables."""

LIMITS_TEXT = ("batches/s: 256 random rows gathered into preallocated arrays (np.take out=), from the "
               "process's own memory or shared memory, field by field or as whole rows of one array, "
               "whichever was fastest; rows/s: memcpy bandwidth (numpy copy of 256 MiB) over the bytes of a row")


GATHERS = {"shared": " (np.take of each field's array: the limit the targets use)",
           "rows": " (np.take of whole rows of one array, as shmbuf packs small fields)",
           "private": " (each field's array)", "private rows": " (whole rows of one array)"}
GATHER_NAMES = {"private": "from private memory, field by field", "private rows": "from private memory, of whole rows",
                "shared": "from shared memory, field by field", "rows": "from shared memory, of whole rows",
                "repeats": "measured in each repeat beside the samples (the faster of private memory field by "
                           "field and of whole rows; the median over the repeats)"}


def si(x: float | None) -> str:
    if x is None:
        return "-"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.3g}"


def spread(vals: list[float] | None) -> float | None:
    """(max - min) / median of the repeats, in percent (None for fewer than 2, or a median of 0).

    >>> spread([90.0, 100.0, 105.0])
    15.0
    """
    if not vals or len(vals) < 2:
        return None
    med = statistics.median(vals)
    return 100 * (max(vals) - min(vals)) / med if med else None


def _cell(vals: list[float] | None, unit: str) -> str:
    """``median (min-max, spread%)``, the spread in bold past :data:`SPREAD_MARK`."""
    if not vals:
        return "-"
    med = statistics.median(vals)
    fmt = (lambda v: f"{v:.2f}") if unit == "GB/s" else si
    if len(vals) == 1:
        return fmt(med)
    return f"{fmt(med)} ({fmt(min(vals))}-{fmt(max(vals))}, {marked(spread(vals))})"


def pct(sp: float) -> str:
    """A spread in percent: 1 decimal below 20 (10.4 is not 10).

    >>> pct(10.4), pct(23.6)
    ('10.4%', '24%')
    """
    return f"{sp:.1f}%" if sp < 20 else f"{sp:.0f}%"


def marked(sp: float | None) -> str:
    """:func:`pct`, in bold past :data:`SPREAD_MARK`; ``-`` for None."""
    return "-" if sp is None else (f"**{pct(sp)}**" if sp > SPREAD_MARK else pct(sp))


def _of_limit(v: float | None, limit: float | None) -> str:
    """``v / limit`` (2 decimals, or 2 significant digits below 0.1), ``-`` where either is missing."""
    if v is None or not limit:
        return "-"
    x = v / limit
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def limit(r: Results, wl: str, unit: str) -> float | None:
    """What the machine allows a figure of ``unit`` on workload ``wl`` (see
    :func:`benchmarks.limits.record_limits`), measured in this run; None if not measured."""
    return r.extra.get("limits", {}).get(wl, {}).get(unit)


def figures_table(r: Results, wl: str) -> str:
    fig = r.figures.get(wl, {})
    systems = [s for s in SYSTEMS if any(s in fig.get(m, {}) for m, _, _ in METRICS)]
    lines = [f"| {wl}: metric | unit | " + " | ".join(systems) + " |",
             "|---|---|" + "---:|" * len(systems)]
    for key, what, unit in METRICS:
        if key in fig:
            lines.append(f"| {what} | {unit} | " + " | ".join(_cell(fig[key].get(s), unit) for s in systems) + " |")
    return "\n".join(lines)


def limits_table(r: Results, wl: str) -> str:
    """Every figure of the workload over the machine's limit measured in this run."""
    lim = r.extra.get("limits", {}).get(wl)
    fig = r.figures.get(wl, {})
    if not lim or not fig:
        return ""
    systems = [s for s in SYSTEMS if any(s in fig.get(m, {}) for m, _, _ in METRICS)]
    lines = [f"| {wl}: figure / machine limit | limit | " + " | ".join(systems) + " |",
             "|---|---:|" + "---:|" * len(systems)]
    for key, what, unit in METRICS:
        if key in fig and unit in lim:
            lines.append(f"| {what} | {si(lim[unit])} {unit} | "
                         + " | ".join(_of_limit(r.median(wl, key, s), lim[unit]) for s in systems) + " |")
    lines += ["", f"Limits measured in this run ({LIMITS_TEXT}). Here: the gather "
              f"{GATHER_NAMES.get(lim.get('gather'), lim.get('gather'))}; memcpy {r.extra['memcpy GB/s']:.1f} GB/s "
              f"over {lim['row bytes']:,} bytes."]
    return "\n".join(lines)


def default_vs_out(r: Results) -> list[tuple[str, float | None, float | None]]:
    """(what, default call's median, out= call's median) of every system measured both
    ways: the main workloads' ``sample`` and ``sample out=``, the episode part's
    ``Buffer`` and ``Buffer out=``, the strategies part's ``shmbuf uniform`` and ``... out=``."""
    out = []
    for wl, fig in r.figures.items():
        for system in fig.get("sample out=", {}):
            out.append((f"{wl}: sample 256, {system}", r.median(wl, "sample", system),
                        r.median(wl, "sample out=", system)))
    parts = [(f"episodes, {wl}: {metric}", systems) for wl, metrics in r.extra.get("episodes", {}).items()
             for metric, systems in metrics.items()]
    parts += [(f"strategies: {metric}", systems) for metric, systems in r.extra.get("strategies", {}).items()]
    for what, systems in parts:
        for system, vals in systems.items():
            if system.endswith(" out="):
                base = system[:-len(" out=")]
                out.append((f"{what}, {base}", _med(systems.get(base)), _med(vals)))
    return out


def default_vs_out_table(r: Results) -> str:
    rows = default_vs_out(r)
    if not rows:
        return ""
    lines = ["| default call / out= call (calls per second) | default | out= | default / out= |",
             "|---|---:|---:|---:|"]
    for what, a, b in rows:
        lines.append(f"| {what} | {si(a)} | {si(b)} | {_of_limit(a, b)} |")
    return "\n".join(lines)


def spreads(r: Results) -> list[tuple[str, float]]:
    """(figure, spread %) of every figure with 2 or more repeats (GB/s rows left out:
    they are the batches/s rows scaled)."""
    out = []
    for wl, fig in r.figures.items():
        for metric, systems in fig.items():
            if not metric.endswith("GB/s"):
                out += [(f"{wl} {metric} {s}", spread(v)) for s, v in systems.items()]
    for wl, metrics in r.extra.get("episodes", {}).items():
        for metric, systems in metrics.items():
            out += [(f"episodes {wl} {metric.replace(' (rows/s)', '')} {s}", spread(v)) for s, v in systems.items()]
    for metric, systems in r.extra.get("strategies", {}).items():
        out += [(f"strategies {metric.replace(' (rows/s)', '')} {s}", spread(v)) for s, v in systems.items()]
    return [(what, sp) for what, sp in out if sp is not None]


def spread_note(r: Results) -> str:
    """What the spread is and which figures pass :data:`SPREAD_MARK`."""
    got = spreads(r)
    if not got:
        return ""
    wide = sorted((x for x in got if x[1] > SPREAD_MARK), key=lambda x: -x[1])
    head = (f"Spread: (max - min) / median over the repeats of each figure, in bold where it passes "
            f"{SPREAD_MARK:g}%: ")
    if not wide:
        return head + f"none of the {len(got)} figures here does."
    return head + f"{len(wide)} of the {len(got)} figures here do (treat them as rough): " \
        + ", ".join(f"{what} {pct(sp)}" for what, sp in wide) + "."


def _ratio(r: Results, wl: str, key: str, other: str, other_key: str | None = None,
           system: str = "shmbuf") -> float | None:
    a = r.median(wl, key, system)
    b = r.median(wl, other_key or key, other)
    return a / b if a is not None and b else None


def targets(r: Results, wl: str) -> list[tuple[str, float | None, str, bool | None]]:
    """(what, ratio, target, met) for every target of the native-path issue (the floor is
    the in-process numpy ring; "2w" figures are compared with 1 writer of the floor)."""
    out: list[tuple[str, float | None, str, bool | None]] = []

    def want(what: str, v: float | None, at_least: float) -> None:
        out.append((what, v, f">= {at_least:g}", None if v is None else v >= at_least))

    limit = r.extra.get("gather batches/s", {}).get(wl, {}).get("shared")
    sample = r.median(wl, "sample", "shmbuf")
    want("sample (default call) vs the gather limit (shared memory)", sample / limit if sample and limit else None, 0.8)
    into = r.median(wl, "sample out=", "shmbuf")
    want("sample out= vs the gather limit (shared memory)", into / limit if into and limit else None, 0.8)
    pure = r.median(wl, "sample", "shmbuf-py")
    want("pure Python: sample (default call) vs the gather limit", pure / limit if pure and limit else None, 0.8)
    if wl == "atari":
        beside = r.median(wl, "sample +1w", "shmbuf")
        want("sample +1w vs sample alone (default calls)", beside / sample if beside and sample else None, 0.75)
        want("e2e batches vs cpprb", _ratio(r, wl, "e2e batches", "cpprb"), 1)
        want("e2e ingest vs cpprb", _ratio(r, wl, "e2e ingest", "cpprb"), 1)
        want("learner first (shmbuf-lf): e2e batches vs cpprb", _ratio(r, wl, "e2e batches", "cpprb", system="shmbuf-lf"), 1)
        want("learner first (shmbuf-lf): e2e ingest vs cpprb", _ratio(r, wl, "e2e ingest", "cpprb", system="shmbuf-lf"), 1)
        want("add 1w x1 vs numpy floor", _ratio(r, wl, "add 1w x1", "numpy"), 0.9)
        want("add 1w x64 vs numpy floor", _ratio(r, wl, "add 1w x64", "numpy"), 0.9)
        want("sample vs numpy floor (default calls)", _ratio(r, wl, "sample", "numpy"), 0.9)
        want("sample out= vs numpy floor (out= both)", _ratio(r, wl, "sample out=", "numpy"), 0.9)
    else:
        want("add 1w x1 vs numpy floor", _ratio(r, wl, "add 1w x1", "numpy"), 2)
        want("add 1w x1 vs cpprb", _ratio(r, wl, "add 1w x1", "cpprb"), 10)
        want("add 1w x64 vs numpy floor", _ratio(r, wl, "add 1w x64", "numpy"), 1.3)
        a, b = r.median(wl, "add 2w x64", "shmbuf"), r.median(wl, "add 1w x64", "shmbuf")
        want("2 writers x64 vs 1 writer x64", a / b if a and b else None, 1.6)
        want("sample vs numpy floor (default calls)", _ratio(r, wl, "sample", "numpy"), 1.2)
        want("sample out= vs numpy floor (out= both)", _ratio(r, wl, "sample out=", "numpy"), 1.2)
        want("e2e ingest vs cpprb", _ratio(r, wl, "e2e ingest", "cpprb"), 5)
        want("e2e ingest vs naive queue", _ratio(r, wl, "e2e ingest", "naive"), 5)
        want("e2e batches vs naive queue", _ratio(r, wl, "e2e batches", "naive"), 5)
    want("pure Python: add 1w x64 vs numpy floor",
         _ratio(r, wl, "add 1w x64", "numpy", system="shmbuf-py"), 0.6)
    want("pure Python: sample vs numpy floor (default calls)", _ratio(r, wl, "sample", "numpy", system="shmbuf-py"), 0.9)
    return out


def ratios_table(r: Results, wl: str) -> str:
    fig = r.figures.get(wl, {})
    others = [s for s in SYSTEMS[2:] if any(s in fig.get(m, {}) for m, _, _ in METRICS)]
    lines = [f"| {wl}: shmbuf ... | " + " | ".join(f"shmbuf / {o}" for o in others) + " |",
             "|---|" + "---:|" * len(others)]
    for key, what, unit in METRICS:
        if key not in fig or unit == "GB/s":
            continue
        floor_key = key.replace("2w", "1w") if key.startswith("add") else key
        cells = [_ratio(r, wl, key, o, floor_key if o in ("numpy", "sb3") else None) for o in others]
        lines.append(f"| {what} | " + " | ".join("-" if c is None else f"{c:.2f}x" for c in cells) + " |")
    return "\n".join(lines)


def targets_table(r: Results, wl: str) -> str:
    lines = [f"| {wl}: target | ratio | wanted | met |", "|---|---:|---|---|"]
    for what, ratio, want, met in targets(r, wl):
        lines.append(f"| {what} | {'-' if ratio is None else f'{ratio:.2f}'} | {want} | "
                     f"{'-' if met is None else ('yes' if met else '**no**')} |")
    return "\n".join(lines)


def extra_table(r: Results) -> str:
    e: dict[str, Any] = r.extra
    lines = ["| physical limit / piece | value |", "|---|---:|"]
    if "memcpy GB/s" in e:
        lines.append(f"| memcpy of 256 MiB (numpy) | {e['memcpy GB/s']:.1f} GB/s |")
    for wl, d in e.get("gather GB/s", {}).items():
        for where, v in d.items():
            mem = "private memory" if where.startswith("private") else f"{where} memory"
            lines.append(f"| random gather of 256 {wl} rows, {mem}{GATHERS.get(where, '')} | {v:.2f} GB/s "
                         f"({si(e['gather batches/s'][wl][where])} batches/s) |")
    if "lock uncontended ns/pair" in e:
        lines.append(f"| header lock, uncontended acquire + release | {e['lock uncontended ns/pair']:.0f} ns |")
        lines.append(f"| header lock, 2 processes contending, per acquire + release | "
                     f"{e['lock contended ns/pair']:.0f} ns |")
    for wl, v in e.get("torn-read check us/batch", {}).items():
        lines.append(f"| torn-read check (2 stamp gathers + compare), {wl} batch of 256 | {v:.1f} us |")
    for wl, d in e.get("bytes per transition", {}).items():
        cells = ", ".join(f"{k} {v:,.0f}" for k, v in d.items() if v is not None)
        lines.append(f"| {wl}: bytes of memory per transition (PSS growth / capacity) | {cells} |")
    for wl, d in e.get("attached processes", {}).items():
        uss = ", ".join(f"{p['uss'] / 2**20:.0f} MiB" for p in d["per process"])
        lines.append(f"| {wl}: 2 attached processes after sampling {d['batches sampled each']:,} batches each: "
                     f"private memory (USS) | {uss} (buffer: {d['buffer bytes'] / 2**20:,.0f} MiB) |")
    return "\n".join(lines)


def _med(vals: list[float] | None) -> float | None:
    return statistics.median(vals) if vals else None


def _unit(metric: str) -> str:
    return "rows/s" if "rows/s" in metric else "batches/s"


def _target_row(what: str, ratio: float | None, want: float | None) -> str:
    """``| what | ratio | >= want | yes/**no** |`` (``-`` where a figure is missing)."""
    met = "-" if ratio is None or want is None else ("yes" if ratio >= want else "**no**")
    return (f"| {what} | {'-' if ratio is None else f'{ratio:.2f}'} | "
            f"{'-' if want is None else f'>= {want:g}'} | {met} |")


def episodes_tables(r: Results) -> str:
    """EpisodeBuffer beside Buffer: figures, the targets, memory per transition."""
    from benchmarks.episodes import ratios

    figs = r.extra.get("episodes")
    if not figs:
        return ""
    names = [n for n in ("Buffer", "Buffer out=", "EpisodeBuffer")
             if any(n in systems for metrics in figs.values() for systems in metrics.values())]
    lines = ["| episodes: workload, metric | unit | " + " | ".join(names) + " | limit | / limit: "
             + ", ".join(names) + " |", "|---|---|" + "---:|" * len(names) + "---:|---:|"]
    for wl, metrics in figs.items():
        for metric, systems in metrics.items():
            unit = _unit(metric)
            lim = limit(r, wl, unit)
            lines.append(f"| {wl}: {metric.replace(' (rows/s)', '')} | {unit} | "
                         + " | ".join(_cell(systems.get(n), unit) for n in names)
                         + f" | {si(lim)} | "
                         + ", ".join(_of_limit(_med(systems.get(n)), lim) for n in names) + " |")
    lines += ["", "| episodes: target (EpisodeBuffer / Buffer) | ratio | wanted | met |", "|---|---:|---|---|"]
    lines += [_target_row(f"{wl}: {what}", ratio, want) for wl, what, ratio, want in ratios(figs)]
    mem = r.extra.get("episode memory", {})
    if mem:
        lines += ["", "| memory per transition | bytes | vs Buffer |", "|---|---:|---:|"]
        for wl, row in mem.items():
            base = row.get("Buffer (obs + next_obs)")
            for what, v in row.items():
                rel = "-" if v is None or not base else f"{v / base:.3f}"
                lines.append(f"| {wl}: {what} | {'-' if v is None else f'{v:,.0f}'} | {rel} |")
    return "\n".join(lines)


def strategies_tables(r: Results) -> str:
    """Prioritized replay and hindsight: figures, then the ratios (and targets)."""
    from benchmarks.strategies import ratios

    figs = r.extra.get("strategies")
    if not figs:
        return ""
    from benchmarks.strategies import LIMITS

    lines = ["| strategies: metric | system | unit | median (min-max, spread) | limit | / limit |",
             "|---|---|---|---:|---:|---:|"]
    for metric, systems in figs.items():
        unit = _unit(metric)
        lim = limit(r, LIMITS.get(metric, ""), unit)
        for system, vals in systems.items():
            lines.append(f"| {metric.replace(' (rows/s)', '')} | {system} | {unit} | {_cell(vals, unit)} | "
                         f"{si(lim)} | {_of_limit(_med(vals), lim)} |")
    lines += ["", "| strategies: ratio | value | wanted | met |", "|---|---:|---|---|"]
    lines += [_target_row(what, ratio, want) for what, ratio, want in ratios(figs)]
    return "\n".join(lines)


def markdown(r: Results) -> str:
    m = r.machine
    head = (f"scripts/bench ({'quick' if r.config.get('quick') else 'full'}: {r.config['repeats']} repeats, "
            f"{r.config['window']} s windows; end to end {r.config['e2e_repeats']} x {r.config['e2e_window']} s) on {m['cpus']} cores, "
            f"{m['memory GiB']} GiB, Python {m['python']}, numpy {m['numpy']}, cpprb {m['cpprb']}"
            + (f", torch {m['torch']}, torchrl {m['torchrl']}, stable-baselines3 {m['stable-baselines3']}"
               if m.get("torchrl") else "") + f", {m['date']}.\n"
            "Figures: median (min-max, spread) over repeats; spread = (max - min) / median, in bold past "
            f"{SPREAD_MARK:g}%. \"sample\" is the call users write, a new batch each call "
            "(buf.sample(256); the numpy ring's np.take without out=); \"sample out=\" refills one "
            "preallocated batch (buf.sample(256, out=b); np.take(..., out=)), for the systems whose API "
            "has it (cpprb, torchrl and sb3 have only their default); the learners beside writers "
            "(sample +1w, end to end) use the default call. Each figure is also set against the "
            "machine's limit measured in this run (the \"figure / machine limit\" tables). "
            "shmbuf = the native path, shmbuf-py = the "
            "pure-Python path (both one lane per writer); numpy = in-process ring, no IPC (the floor); "
            "naive = writers -> multiprocessing.Queue -> learner's numpy ring; sb3 = one process, "
            "one transition per add; shmbuf-lf = shmbuf with the learner first (a RateLimit of "
            f"{r.extra.get('learner first: samples per insert', 0):g} samples per insert holds writers to the learner; "
            "measured after the others, see benchmarks/learner.py).\n")
    parts = [head]
    for wl, names in r.extra.get("skipped", {}).items():
        parts.append(f"{wl}: {', '.join(names)} left out: not enough memory for every buffer at once.\n")
    for wl in r.figures:
        parts += [figures_table(r, wl), "", limits_table(r, wl), "", ratios_table(r, wl), "",
                  targets_table(r, wl), ""]
    if r.figures:
        parts.append(extra_table(r))
    for part in (episodes_tables(r), strategies_tables(r), default_vs_out_table(r), spread_note(r)):
        if part:
            parts += ["", part]  # (a blank line between tables: else markdown joins them)
    return "\n".join(parts)
