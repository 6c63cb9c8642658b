#!/usr/bin/env python3
"""Regenerate ``hooks/xid_catalog.csv``, the XID facts autoheal ships, from NVIDIA's Xid catalog.

Input: NVIDIA's ``Xid-Catalog.xlsx`` (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the
Xid Catalog"; NVIDIA/NVSentinel embeds it as health-monitors/syslog-health-monitor/pkg/common/) or a
CSV of its main columns (the team's /work/shared/reference/nvidia-xid-catalog.csv). Standard library
only (an .xlsx is a zip of XML sheets), so it runs anywhere the repository is checked out:

    python3 tools/xid_catalog.py Xid-Catalog.xlsx --date 2026-12-01 > hooks/xid_catalog.csv
    python3 tools/xid_catalog.py nvidia-xid-catalog.csv --source "..." > hooks/xid_catalog.csv

Output columns: xid, mnemonic, description, one yes/no/blank column per GPU generation (blank: the
source does not say), immediate and investigatory resolution bucket. ``#`` lines at the top name the
source and its date; ``tests/unit/test_xid_catalog.py`` holds the shipped policy against this file.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import re
import sys
import xml.etree.ElementTree as ET
import zipfile
from typing import Dict, Iterable, List, Optional

GENERATIONS = ("A100", "H100", "B100", "GB200")
COLUMNS = ("xid", "mnemonic", "description") + tuple(g.lower() for g in GENERATIONS) + ("immediate", "investigatory")
_NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL_NS = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip().lower()


def _cell_index(ref: str) -> int:
    """``C7`` -> 2 (zero-based column)."""
    col = 0
    for ch in ref:
        if not ch.isalpha():
            break
        col = col * 26 + (ord(ch.upper()) - 64)
    return col - 1


def xlsx_sheets(path: str) -> Dict[str, List[List[str]]]:
    """Every sheet of an .xlsx as rows of cell text, by sheet name."""
    with zipfile.ZipFile(path) as zf:
        shared: List[str] = []
        if "xl/sharedStrings.xml" in zf.namelist():
            for si in ET.fromstring(zf.read("xl/sharedStrings.xml")).iter(f"{_NS}si"):
                shared.append("".join(t.text or "" for t in si.iter(f"{_NS}t")))
        book = ET.fromstring(zf.read("xl/workbook.xml"))
        rels = ET.fromstring(zf.read("xl/_rels/workbook.xml.rels"))
        target = {r.get("Id"): r.get("Target", "") for r in rels}
        out: Dict[str, List[List[str]]] = {}
        for sheet in book.iter(f"{_NS}sheet"):
            part = target.get(sheet.get(f"{_REL_NS}id"), "").lstrip("/")
            part = part if part.startswith("xl/") else "xl/" + part
            rows: List[List[str]] = []
            for row in ET.fromstring(zf.read(part)).iter(f"{_NS}row"):
                cells: Dict[int, str] = {}
                for c in row.iter(f"{_NS}c"):
                    v = c.find(f"{_NS}v")
                    if c.get("t") == "inlineStr":
                        text = "".join(t.text or "" for t in c.iter(f"{_NS}t"))
                    elif v is None:
                        text = ""
                    elif c.get("t") == "s":
                        text = shared[int(v.text or 0)]
                    else:
                        text = v.text or ""
                    cells[_cell_index(c.get("r", "A"))] = text
                if cells:
                    rows.append([cells.get(i, "") for i in range(max(cells) + 1)])
            out[sheet.get("name", "")] = rows
    return out


def _yes_no(text: str) -> str:
    t = _norm(text)
    if t in ("yes", "y", "x", "true", "1"):
        return "yes"
    if t in ("no", "n", "false", "0", "-"):
        return "no"
    return ""


def rows_from_table(rows: List[List[str]]) -> List[Dict[str, str]]:
    """Catalog rows from a table whose header names NVIDIA's columns (the sheet, or the team's CSV)."""
    header = [_norm(h) for h in rows[0]]

    def find(*needles: str) -> Optional[int]:
        for i, h in enumerate(header):
            if all(n in h for n in needles):
                return i
        return None

    code = find("code")
    if code is None:
        code = find("xid")
    cols = {"mnemonic": find("mnemonic"), "description": find("description"),
            "immediate": find("immediate"), "investigatory": find("investigatory")}
    kind = find("type")
    gens = {g: find(g.lower()) for g in GENERATIONS}
    if code is None or cols["immediate"] is None:
        raise SystemExit(f"xid_catalog: no XID code / immediate-action column in header {rows[0]!r}")
    out = []
    for row in rows[1:]:
        row = row + [""] * (len(header) - len(row))
        if kind is not None and row[kind].strip().upper() not in ("XID", ""):
            continue  # SXid rows of the sheet
        if not row[code].strip().isdigit():
            continue
        rec = {"xid": str(int(row[code]))}
        for key, idx in cols.items():
            rec[key] = re.sub(r"\s+", " ", row[idx]).strip() if idx is not None else ""
        for g, idx in gens.items():
            rec[g.lower()] = _yes_no(row[idx]) if idx is not None else ""
        out.append(rec)
    out.sort(key=lambda r: int(r["xid"]))
    return out


def read_source(path: str) -> List[Dict[str, str]]:
    if path.lower().endswith(".xlsx"):
        sheets = xlsx_sheets(path)
        for _name, rows in sheets.items():  # the catalog sheet is the one with both bucket columns
            if rows and any("immediate" in _norm(h) for h in rows[0]):
                return rows_from_table(rows)
        raise SystemExit(f"xid_catalog: no sheet with an immediate-action column in {path} ({', '.join(sheets)})")
    with open(path, newline="", encoding="utf-8") as fh:
        table = list(csv.reader(line for line in fh if not line.startswith("#")))
    return rows_from_table(table)


def render(records: Iterable[Dict[str, str]], source: str, date: str) -> str:
    buf = io.StringIO()
    buf.write(f"# NVIDIA Xid catalog, main columns. Source: {source}. Date: {date}.\n")
    buf.write("# Regenerate with tools/xid_catalog.py; blank generation cell: the source does not say.\n")
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow({k: r.get(k, "") for k in COLUMNS})
    return buf.getvalue()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="Xid-Catalog.xlsx, or a CSV of its columns")
    ap.add_argument("--source-name", default="", help="what to write as the source (default: the file name)")
    ap.add_argument("--date", default=datetime.date.today().isoformat(), help="date of the source (ISO)")
    args = ap.parse_args(argv)
    records = read_source(args.source)
    if not records:
        print(f"xid_catalog: no XID rows in {args.source}", file=sys.stderr)
        return 1
    sys.stdout.write(render(records, args.source_name or args.source, args.date))
    return 0


if __name__ == "__main__":
    sys.exit(main())
