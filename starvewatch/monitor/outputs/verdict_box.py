"""The verdict box that opens the HTML report, as the answer card opens the dashboard's run page:
the verdict in one sentence, the change with its expected speed-up and reason, the DataLoader
line to copy, and the evidence behind a toggle. The words are the answer card's
(analysis/answer_text.py); this module only lays them out as static HTML."""
from __future__ import annotations

import html

from ...analysis import answer_text
from ...analysis.snippet import snippet
from ... import quantities
from ...quantities import speedup_text

VERDICT_BOX_STYLE = """.sw-answer{border-left:5px solid #2d7ff9;background:#fff;box-shadow:0 1px 3px rgba(0,0,0,.12);
padding:12px 18px;margin:1em 0;border-radius:6px}.sw-verdict{font-size:20px;font-weight:600;margin:4px 0 10px}
.sw-gain{margin-left:12px;background:#3c9d5d;color:#fff;border-radius:12px;padding:2px 10px;font-weight:700}
.sw-muted{color:#667}.sw-answer pre{background:#1d2330;color:#e6edf7;padding:10px 12px;border-radius:6px}
details summary{cursor:pointer;font-weight:600;color:#445}"""


def verdict_box(summary: dict) -> str:
    e = html.escape
    said = summary.get("answer") or {}
    parts = [f"<p class='sw-verdict' id='verdict-sentence'>{e(answer_text.verdict_sentence(summary))}</p>"]
    if said.get("regression"):  # a slower run is never shown as a success alone
        parts.append(f"<p class='sw-regression' id='regression'>{e(said['regression'])}</p>")
    parts += [f"<p class='sw-muted'>{e(line)}</p>" for line in said.get("other_loaders") or []]
    recs = answer_text.speedups(summary)
    if not recs:
        band = summary["verdict"]["input_bound"]
        note = ("No change to recommend yet: " + (said.get("needs_more") or "not enough data to judge") + "."
                if band == "insufficient_data" else
                "No change to recommend: the loop is not waiting for data." if band == "not" else
                summary.get("no_recommendation_reason")
                or "No change to recommend: no DataLoader setting is expected to remove the wait that is left.")
        parts.append(f"<p id='no-recommendation'>{e(note)}</p>")
        return f"<div class='sw-answer' id='answer'>{''.join(parts)}</div>"
    top = recs[0]
    gain = (f"<span class='sw-gain' id='top-speedup'>expected {e(speedup_text(top).replace('x', 'x faster', 1))}"
            f"{' (measured)' if top.get('measured') else ''}</span>") if top.get("expected_speedup") else ""
    parts.append(f"<h3 id='top-change'><span class='sw-muted'>Change </span><b>{e(answer_text.change_text(top))}</b>"
                 f"<span class='sw-muted'> on loader {e(str(top['loader']))}</span>{gain}</h3>")
    if top.get("reason"):
        parts.append(f"<p>{e(str(top['reason']))}</p>")
    config = next((l.get("config") for l in summary["loaders"] if l["name"] == top["loader"]), None)
    code = snippet(config, summary.get("recommendations") or [], top["loader"])
    if code:
        parts.append(f"<pre id='snippet'>{e(code)}</pre>")
    rows = quantities.rows(top.get("evidence"))
    if rows:
        table = "".join(f"<tr><th>{e(str(k))}</th><td>{e(str(v))}</td></tr>" for k, v in rows)
        parts.append(f"<details id='evidence'><summary>Evidence: the {len(rows)} quantities this advice rests on"
                     f"</summary><table>{table}</table></details>")
    return f"<div class='sw-answer' id='answer'>{''.join(parts)}</div>"
