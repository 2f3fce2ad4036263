"""How big a ``memreader view`` page gets and how fast Chromium shows it, by document count, side by side.

    .venv/bin/python scripts/bench_viewer.py                      # 1,000 and 10,000 documents (docs/BENCHMARKS.md)
    .venv/bin/python scripts/bench_viewer.py --docs 100 1000 --repeats 1

Writes synthetic memories shaped like the demo's (``--chars`` per document, five scenarios with an outline item and a
core sentence each), renders each file with :func:`memreader.viewer.page.write_view` and opens the page in headless
Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by Selenium): the time to first render is the page load
(the script draws the list and the first document before the load event), then searching for the last document and
opening it. Prints one row per size with the ratio to the smallest. Artifacts: ``$MEMREADER_HOME/runs/bench-viewer/``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

from memreader.core.paths import run_dir
from memreader.core.schema import DocumentMemory, Scenario, write_memories
from memreader.viewer.page import write_view

SENTENCE = "The committee met on a Tuesday and agreed on the budget for the coming season after a long debate. "


def synthetic(n: int, chars: int) -> list[DocumentMemory]:
    """``n`` memories of about ``chars`` characters in five scenarios each."""
    out = []
    part = max(1, chars // 5)
    for i in range(n):
        text, scenarios = "", []
        for j in range(5):
            body = (f"Section {j} of document {i}. " + SENTENCE * (part // len(SENTENCE) + 1))[:part] + "\n\n"
            scenarios.append(Scenario(f"Part {j} of document {i}: the season's budget", f"Core of part {j}: the "
                                      "committee agreed on the budget.", len(text), len(text) + len(body)))
            text += body
        out.append(DocumentMemory(f"doc-{i:06d}", text, scenarios))
    return out


def chromium():  # noqa: ANN201  (selenium's type, imported lazily)
    """A headless Chromium session, or SystemExit naming the install command."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        raise SystemExit("bench_viewer: needs Chromium and chromedriver: sudo apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver))


def measure(session, page: Path, last_id: str, repeats: int) -> tuple[float, float]:  # noqa: ANN001
    """(median seconds to first render, median seconds to search for the last document and open it)."""
    from selenium.webdriver.common.by import By

    loads, searches = [], []
    for _ in range(repeats):
        session.get("about:blank")
        start = time.perf_counter()
        session.get(page.resolve().as_uri())
        if session.find_element(By.ID, "doctitle").text != "doc-000000":
            raise SystemExit(f"bench_viewer: {page} did not render its first document")
        loads.append(time.perf_counter() - start)
        start = time.perf_counter()
        session.find_element(By.ID, "search").send_keys(last_id)
        session.find_element(By.CSS_SELECTOR, ".docitem").click()
        if session.find_element(By.ID, "doctitle").text != last_id:
            raise SystemExit(f"bench_viewer: searching {page} for {last_id} did not open it")
        searches.append(time.perf_counter() - start)
    return statistics.median(loads), statistics.median(searches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, nargs="+", default=[1000, 10000], help="document counts to compare")
    parser.add_argument("--chars", type=int, default=3000, help="characters per document (the demo's are ~1,000-3,000)")
    parser.add_argument("--repeats", type=int, default=3, help="page loads per size (median reported)")
    args = parser.parse_args()
    out = run_dir("bench-viewer")
    out.mkdir(parents=True, exist_ok=True)
    session = chromium()
    rows = []
    try:
        for n in sorted(args.docs):
            memories = out / f"memories-{n}.jsonl"
            write_memories(memories, synthetic(n, args.chars))
            summary = write_view(memories, out / f"memories-{n}.html")
            load, search = measure(session, summary.path, f"doc-{n - 1:06d}", args.repeats)
            rows.append((n, summary.bytes / 1e6, summary.seconds, load, search))
    finally:
        session.quit()
    base = rows[0]
    print(f"memreader view, {args.chars} chars x 5 scenarios per document, headless Chromium, median of "
          f"{args.repeats} loads")
    print(f"{'docs':>7} {'page MB':>8} {'write s':>8} {'first render s':>15} {'search+open s':>14}   ratios vs "
          f"{base[0]} docs (size, render)")
    for n, mb, write, load, search in rows:
        print(f"{n:>7} {mb:>8.1f} {write:>8.2f} {load:>15.2f} {search:>14.2f}   x{mb / base[1]:.1f}, x{load / base[3]:.1f}")


if __name__ == "__main__":
    main()
