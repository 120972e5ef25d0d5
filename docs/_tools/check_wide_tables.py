"""Check that the built documentation's wide tables show every column at 1280 px, in a real
headless browser, and keep a screenshot for a person to look at.

    python docs/_tools/check_wide_tables.py BUILT_HTML_DIR [--png coming-from-fbgemm.png]

For each page (default: the name maps of ``coming-from-fbgemm.html`` and the extras of
``installation.html``) a copy with a small script
is loaded by headless Chromium at 1280 x 2400; the script measures every table of the article
(its right edge against the window, and whether its frame scrolls) and the DOM is read back.
Exit status 1 when a table is wider than the window or needs scrolling, 0 when every column
shows; with no Chromium on the machine it says so and exits 0, or 1 under ``--require`` (CI).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

WIDTH, HEIGHT = 1280, 2400
PAGES = ("coming-from-fbgemm.html", "installation.html")
PROBE = """<script>
window.addEventListener("load", () => {
  const rows = [...document.querySelectorAll("article table")].map((t) => {
    const frame = t.closest(".table-wrapper") || t;
    return {right: t.getBoundingClientRect().right, scrolls: frame.scrollWidth > frame.clientWidth + 1,
            columns: t.rows.length ? t.rows[0].cells.length : 0};
  });
  document.body.setAttribute("data-embnum-tables", JSON.stringify({width: window.innerWidth, tables: rows}));
});
</script>"""


def chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _browser(exe: str, url: str, *flags: str) -> str:
    args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    args += [f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=5000", *flags, url]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout


def measure(exe: str, page: Path) -> dict:
    probe = page.with_name(f".probe-{page.name}")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>", 1))
    try:
        dom = _browser(exe, probe.as_uri(), "--dump-dom")
    finally:
        probe.unlink()
    found = re.search(r'data-embnum-tables="([^"]*)"', dom)
    if found is None:
        raise RuntimeError(f"the probe did not run in {page}")
    return json.loads(found.group(1).replace("&quot;", '"'))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html", type=Path, help="the built documentation (sphinx -b html output)")
    parser.add_argument("--page", action="append", help=f"page to check (default: {', '.join(PAGES)})")
    parser.add_argument("--png", type=Path, help="also write a screenshot of the first page here")
    parser.add_argument("--require", action="store_true", help="no Chromium is a failure (CI), not a note")
    args = parser.parse_args(argv)
    exe = chromium()
    if exe is None:
        print("wide tables not checked: no Chromium here (apt-get install chromium)")
        return 1 if args.require else 0
    bad = 0
    pages = args.page or list(PAGES)
    for name in pages:
        found = measure(exe, args.html / name)
        for i, t in enumerate(found["tables"]):
            ok = t["right"] <= found["width"] and not t["scrolls"]
            bad += not ok
            print(
                f"{name} table {i}: {t['columns']} columns, right edge {t['right']:.0f} of {found['width']} px"
                f"{', scrolls' if t['scrolls'] else ''}: {'ok' if ok else 'COLUMNS HIDDEN'}"
            )
    if args.png:
        _browser(exe, (args.html / pages[0]).as_uri(), f"--screenshot={args.png}")
        print(f"screenshot: {args.png}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
