"""Counts and data as text: trials by status and NaN cause, the data's NaN summary, the audit, its warnings before
a sweep, and the rows no trial trains on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sweeper.audit import AuditReport, NanRisk


def format_counts(counts: Mapping[str, int], nan_causes: Mapping[str, Sequence[int]] | None = None) -> str:
    """``complete 7 · nan 2 (data 1, precision 1) · oom 2`` in a fixed order, then any other status.

    Args:
        counts: Trials by status (:func:`sweeper.study._snapshot.status_counts`).
        nan_causes: NaN trial numbers by cause (:func:`sweeper.study._snapshot.nan_causes`), shown after the NaN count.
    """
    order = [
        "complete",
        "nan",
        "diverged",
        "oom",
        "predicted_oom",
        "dominated_oom",
        "timeout",
        "crash",
        "error",
        "running",
        "stale",
        "waiting",
        "interrupted",
        "repeated",
    ]
    keys = [k for k in order if k in counts] + sorted(k for k in counts if k not in order)
    parts = []
    for k in keys:
        part = f"{k} {counts[k]}"
        if k == "nan" and nan_causes:
            part += " (" + ", ".join(f"{cause} {len(nums)}" for cause, nums in nan_causes.items()) + ")"
        parts.append(part)
    return " · ".join(parts)


def format_data_nan_summary(
    nan_causes: Mapping[str, Sequence[int]], samples: Mapping[int, Sequence[int]], trials_dir: str
) -> str:
    """One line naming the NaN trials the data caused (empty when none): so that they are not read as a result about
    the hyperparameters.

    Args:
        nan_causes: NaN trial numbers by cause.
        samples: ``nan_samples`` of each trial, by trial number.
        trials_dir: The study's trial folders (``studies/<study>/trials``), where ``nan_batch.jsonl`` lies.
    """
    data = list(nan_causes.get("data", ()))
    if not data:
        return ""
    total = sum(len(v) for v in nan_causes.values())
    blamed = sorted({i for n in data for i in samples.get(n, ())})
    head = (
        f"all {total} NaN trials were"
        if total == len(data) and total > 1
        else "the NaN trial was"
        if total == 1
        else f"{len(data)} of {total} NaN trials were"
    )
    shown = ", ".join(str(i) for i in blamed[:8]) + (f" and {len(blamed) - 8} more" if len(blamed) > 8 else "")
    folder = f"{trials_dir}/{data[0] if len(data) == 1 else '<trial>'}/nan_batch.jsonl"
    return (
        f"{head} caused by the data, not the hyperparameters: trial{'s' if len(data) > 1 else ''} "
        f"{', '.join('#' + str(n) for n in data)}, sample{'s' if len(blamed) != 1 else ''} {shown} "
        f"(rows in {folder})"
    )


def _tokens(value: float) -> str:
    """A token count as the audit shows it: from 10,000 on whole, with thousands separators (``1,300,000``, never
    ``1.3e+06``: issue 68); below, as it is (``2048``, ``80.5``, ``101.25``)."""
    if value >= 10_000:
        return f"{value:,.0f}"
    return f"{value:g}"


def format_audit(report: AuditReport) -> str:
    """``sweep doctor``'s table: token-length percentiles, then one row per finding (kind, max_seq_length, number of
    samples, detail), then whether anything would make a trial NaN."""
    p = report.length_percentiles
    lines = [
        "tokens per sample (chat template included, before truncation): "
        + "  ".join(f"{k} {_tokens(v)}" for k, v in p.items())
    ]
    lengths = ", ".join(str(n) for n in report.max_seq_lengths)
    if report.findings:
        rows = [("kind", "max_seq_length", "samples", "detail")]
        rows += [
            (f.kind, "-" if f.max_seq_length is None else str(f.max_seq_length), str(len(f.samples)), f.detail)
            for f in report.findings
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        table = ["  ".join([c.ljust(w) for c, w in zip(r[:3], widths)] + [r[3]]) for r in rows]
        table.insert(1, "  ".join("-" * w for w in widths) + "  ------")
        lines += ["", *table]
    else:
        lines += ["", "no findings"]
    nan = report.nan_findings
    lines.append("")
    if nan:
        where = sorted({f.max_seq_length for f in nan if f.max_seq_length is not None})
        lines.append(
            (f"NaN risk at max_seq_length {', '.join(map(str, where))}: " if where else "NaN risk: ")
            + "; ".join(
                f"{f.kind}{'' if f.max_seq_length is None else f' at {f.max_seq_length}'} "
                f"({len(f.samples)} sample{'s' if len(f.samples) != 1 else ''})"
                for f in nan
            )
        )
    else:
        lines.append(f"no finding would make a trial NaN at max_seq_length {lengths}")
    return "\n".join(lines)


def format_untrained_rows(file: Any, max_seq_lengths: Sequence[int], doctor: str) -> list[str]:
    """The whole file's rows that would make a NaN step and that the ``max_samples`` audit cannot see, as it did not
    sample them (issue 68): one ``WARNING data:`` line per searched ``max_seq_length`` at which some row of the file
    (``file``, a :class:`sweeper.data.FileLengths`) outside the trials' sampled rows keeps no supervised token,
    naming the rows (the sampled ones among them have the sampled audit's own line), and the choice: drop them, or
    raise the length. Empty when the trials sample the whole file, or no such row lies outside their sample."""
    if not file.cut:
        return []
    lines = []
    trials = {i for i, _ in file.lengths[: file.sampled]}  # the file's rows in the trials' order: theirs first
    for length in sorted(set(max_seq_lengths)):
        rows = [i for i in file.untrained_rows(length) if i not in trials]
        if not rows:
            continue
        one = len(rows) == 1
        shown = ", ".join(map(str, rows[:8])) + (f" and {len(rows) - 8} more" if len(rows) > 8 else "")
        lines.append(
            f"WARNING data: at max_seq_length={length}, {len(rows)} of the file's {len(file.lengths)} rows outside "
            f"the trials' {file.sampled} sampled rows (dataset.max_samples) keep{'s' if one else ''} no supervised "
            f"token (row{'' if one else 's'} {shown}: the reply starts past the cut, or there is none); a step of "
            "only such rows averages its loss over zero tokens, a NaN; no trial trains "
            f"{'it' if one else 'them'}, the exports train every row: drop {'it' if one else 'them'} from the file, "
            f"or raise max_seq_length above {'its' if one else 'their'} reply's start ({doctor})"
        )
    return lines


def format_data_warnings(
    report: AuditReport, risks: Sequence[NanRisk], *, several_accumulations: bool, doctor: str
) -> list[str]:
    """Before the first trial: one ``WARNING data:`` line per finding that would make trials NaN (naming the batch
    sizes and the step where it strikes), or one ``data`` line saying there is none; other findings are named after.

    Args:
        report: The audit at the searched ``max_seq_length`` values.
        risks: :func:`sweeper.audit.nan_risks` of its NaN findings.
        several_accumulations: The sweep searches ``gradient_accumulation_steps`` (then named in the strike).
        doctor: The ``sweep doctor`` command to point to.
    """
    lines = []
    for risk in risks:
        finding, hits = risk.finding, risk.strikes
        if hits:
            (b, ga), hit = min(hits.items(), key=lambda kv: kv[1].step)
            sizes = ", ".join(sorted({str(k[0]) for k in hits}, key=int))
            strikes = (
                f"batch {sizes} go{'es' if len(hits) == 1 else ''} NaN (batch {b}"
                + (f", gradient_accumulation_steps {ga}" if several_accumulations else "")
                + f": step {hit.step}, sample{'s' if len(hit.samples) > 1 else ''} "
                f"{', '.join(map(str, hit.samples[:6]))})"
            )
        else:
            strikes = f"no step of the first {risk.max_steps} is made only of them, a longer run would be"
        if finding.kind == "bad_embedding_row":
            lines.append(
                f"WARNING data: {finding.detail}; {strikes}: a data fault, not a hyperparameter result ({doctor})"
            )
            continue
        what = {
            "no_supervised_tokens": "no supervised token left (the reply is cut away)",
            "invalid_token_id": f"token ids outside the model's {report.vocab_size} embedding rows",
        }.get(finding.kind, finding.kind)
        lines.append(
            f"WARNING data: at max_seq_length={finding.max_seq_length}, {len(finding.samples)} of "
            f"{report.samples} samples have {what}; {strikes}: a data fault, not a hyperparameter result "
            f"({doctor})"
        )
    others = sorted({f.kind for f in report.findings if not f.nan_risk})
    if not lines:
        lines.append(
            f"data    audited at max_seq_length {', '.join(map(str, report.max_seq_lengths))}: nothing that "
            "would make a trial NaN" + (f"; also found: {', '.join(others)} ({doctor})" if others else "")
        )
    elif others:
        lines.append(f"data    also found: {', '.join(others)} ({doctor})")
    return lines


def format_dropped_rows(dropped: Sequence[Any], rows: int, path: str, *, doctor: str) -> str | None:
    """One ``WARNING data:`` line for the dataset rows a trial will not train on, counted by reason (None when
    every row is used), so that no row is left out silently.

    Args:
        dropped: :func:`sweeper.data.unused_rows` (``index`` and ``reason`` each).
        rows: Rows in the dataset (``load_samples(...).rows``).
        path: ``dataset.path``, to name the file.
        doctor: The ``sweep doctor`` command that lists them.
    """
    if not dropped:
        return None
    groups: dict[str, list[int]] = {}
    for d in dropped:
        groups.setdefault(d.reason, []).append(d.index)
    parts = []
    for reason, indices in sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1]))):
        indices = sorted(indices)
        shown = ", ".join(str(i) for i in indices[:5]) + (f" and {len(indices) - 5} more" if len(indices) > 5 else "")
        parts.append(f"{len(indices)} {reason} (row{'s' if len(indices) != 1 else ''} {shown})")
    total = len(dropped)
    return (
        f"WARNING data: {total} of {rows} rows of {path} {'is' if total == 1 else 'are'} not trained on: "
        f"{'; '.join(parts)} ({doctor})"
    )
