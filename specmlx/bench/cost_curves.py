"""Call-cost curves: v(n) for n = 1..16 and c, per target dtype and BLAS, side by side.

`specmlx calibrate --every-size --json FILE` writes one record (what was measured: the
target's and draft's weights, the device and BLAS, and the profile); `specmlx cost-curves`
reads several and draws them in one PNG and one Markdown table, so the regimes a user may run
(fp32, 8-bit, 4-bit; an optimised or a reference BLAS) can be read against the two lines that
bound speculation: a flat v(n) = 1 (memory-bound: n tokens for the price of one) and
v(n) = n (compute-bound: nothing to gain).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from specmlx.bench.environment import model_info
from specmlx.engine.costs import CostProfile
from specmlx.errors import UsageError

# The sizes the table prints (the plot draws them all).
TABLE_SIZES = (2, 4, 8, 16)


def record(models: Any, with_draft: bool, profile: CostProfile, key: dict[str, Any]) -> dict:
    """What `calibrate --json` writes: the calibration key, both models' weights, the costs."""
    draft = model_info(models.draft, models.draft_path) if with_draft else None
    return {
        "key": key,
        "target": model_info(models.target, models.target_path),
        "draft": draft,
        "profile": profile.as_dict(),
    }


def load_records(paths: list[Path]) -> list[dict[str, Any]]:
    """Records written by `calibrate --json`, in the order given; a bad file is one line."""
    records = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            data["profile"]["v"] = {int(k): float(r) for k, r in data["profile"]["v"].items()}
            # What the table and plot read besides v: a record lacking one is not a record.
            if not all(
                isinstance(value, (int, float))
                for value in (
                    data["profile"]["target_call_seconds"],
                    data["target"]["bytes_per_call"],
                )
            ) or not isinstance(data["key"]["backend"], str):
                raise ValueError
        except OSError as error:
            raise UsageError(f"cannot read {path}: {error.strerror}") from None
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UsageError(f"{path}: not a `specmlx calibrate --json` record") from None
        records.append(data)
    return records


def label(data: dict[str, Any]) -> str:
    """`1.5B 4-bit, OpenBLAS`: the target's size and dtype, and the BLAS the CPU used."""
    target = data["target"]
    bits = (target.get("quantization") or {}).get("bits")
    dtype = f"{bits}-bit" if bits else target.get("dtype") or "?"
    count = target.get("parameters") or 0
    size = f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M" if count else ""
    return f"{size} {dtype}, {_blas(data)}".strip()


def _blas(data: dict[str, Any]) -> str:
    """The BLAS's name as `specmlx.engine.device.blas_in_use` gives it, without its path
    (OpenBLAS, reference BLAS, Accelerate, MKL); on a GPU, the backend."""
    key = data["key"]
    if key["backend"] != "cpu":
        return key["backend"]
    return (key.get("blas") or "unknown BLAS").split(" (")[0].split(",")[0]


def to_markdown(records: list[dict[str, Any]]) -> str:
    """One row a record: target weights, one-token call, c, and v(n) at TABLE_SIZES."""
    header = ["target, BLAS", "GB read a call", "one-token call", "c (draft)"]
    header += [f"v({n})" for n in TABLE_SIZES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for data in records:
        profile = data["profile"]
        skipped = set(profile.get("interpolated") or ())
        cells = [
            label(data),
            f"{data['target']['bytes_per_call'] / 1e9:.2f}",
            f"{profile['target_call_seconds'] * 1000:.0f} ms",
            _c(profile) or "—",
        ]
        cells += [f"{profile['v'][n]:.2f}{'*' if n in skipped else ''}" for n in TABLE_SIZES]
        lines.append("| " + " | ".join(cells) + " |")
    if any(data["profile"].get("interpolated") for data in records):
        lines += ["", "\\* interpolated: not timed, to keep within the calibration's budget"]
    return "\n".join(lines) + "\n"


def _c(profile: dict[str, Any]) -> str | None:
    """c to three places, or None without a draft model."""
    return f"{profile['c']:.3f}" if profile.get("draft_call_seconds") else None


def plot_png(records: list[dict[str, Any]]) -> bytes:
    """v(n) against n, one line a record, between the memory-bound and compute-bound lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.8))
    top = max(max(data["profile"]["v"]) for data in records)
    sizes = list(range(1, top + 1))
    ax.plot(sizes, sizes, color="lightgray", linestyle="--", label="v(n) = n (compute-bound)")
    ax.plot(sizes, [1] * len(sizes), color="gray", linestyle=":", label="v(n) = 1 (memory-bound)")
    for data in records:
        v = data["profile"]["v"]
        c = _c(data["profile"])
        name = f"{label(data)} (c = {c})" if c else label(data)
        ax.plot(sorted(v), [v[n] for n in sorted(v)], marker="o", markersize=3, label=name)
    ax.set_xlabel("n, tokens in one target call")
    ax.set_ylabel("v(n): an n-token call over a one-token call")
    ax.set_yscale("log", base=2)
    ax.set_title("What a verify call costs, per target dtype and BLAS")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out.getvalue()
