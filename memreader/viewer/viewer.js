// memreader view: one document at a time from the JSON block; all text goes in through textContent.
const DATA = JSON.parse(document.getElementById("memreader-data").textContent);
const DOCS = DATA.docs;
const LIST_MAX = 300;  // list items drawn at once: a 10,000-document file opens as fast as a small one
const $ = (id) => document.getElementById(id);

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function fmt(v) {
  if (typeof v === "number" && !Number.isInteger(v)) return v.toFixed(4);
  if (typeof v === "boolean") return v ? "yes" : "no";
  return v === undefined || v === null ? "-" : String(v);
}

// -- the document list ------------------------------------------------------------------------------
let haystacks = null;
function drawList() {
  const q = $("search").value.trim().toLowerCase();
  if (q && haystacks === null) {
    haystacks = DOCS.map((d) => (d.id + "\n" + d.sc.map((s) => s[2]).join("\n")).toLowerCase());
  }
  const list = $("doclist");
  list.replaceChildren();
  let shown = 0, matched = 0;
  for (let i = 0; i < DOCS.length; i++) {
    if (q && haystacks[i].indexOf(q) < 0) continue;
    matched++;
    if (shown >= LIST_MAX) continue;
    const d = DOCS[i];
    const item = el("li", {"data-i": i, class: "docitem" + (d.problems ? " bad" : "")}, d.id);
    item.appendChild(el("span", {class: "muted"}, " " + d.sc.length + " chunks"));
    item.addEventListener("click", () => { location.hash = "doc=" + encodeURIComponent(d.id); });
    list.appendChild(item);
    shown++;
  }
  $("listcount").textContent = matched + " of " + DOCS.length + " documents" +
    (matched > shown ? " (first " + shown + " listed: refine the search)" : "");
}

// -- one document ------------------------------------------------------------------------------------
function segments(text, sc) {
  // pieces in document order: chunks, and the gaps no chunk covers; an overlap is marked on the later chunk
  const out = [];
  let pos = 0;
  sc.forEach((s, i) => {
    let a = Math.max(0, Math.min(s[0], text.length));
    const b = Math.max(0, Math.min(s[1], text.length));
    if (b <= a) return;  // empty or reversed: named in the problems above the text
    if (a > pos) out.push({kind: "gap", a: pos, b: a});
    let overlap = 0;
    if (a < pos) { overlap = Math.min(b, pos) - a; a = Math.max(a, pos); }
    if (b > a) { out.push({kind: "chunk", a: a, b: b, i: i, overlap: overlap}); pos = b; }
  });
  if (pos < text.length) out.push({kind: "gap", a: pos, b: text.length});
  return out;
}

function showChunk(d, i) {
  const s = d.sc[i];
  const panel = $("chunkinfo");
  const head = "chunk " + (i + 1) + " [" + s[0] + ", " + s[1] + ") · " + (s[1] - s[0]) + " chars";  // as the outline
  panel.replaceChildren(el("h3", {}, head));
  panel.appendChild(el("div", {class: "label"}, "outline"));
  panel.appendChild(el("div", {class: "outline-text"}, s[2]));
  panel.appendChild(el("div", {class: "label"}, "core"));
  panel.appendChild(el("div", {class: "core-text"}, s[3]));
  const w = d.where ? d.where[i] : "";  // "file p. 3-4 · Heading > Sub", written by describe_where
  if (w) { panel.appendChild(el("div", {class: "label"}, "from")); panel.appendChild(el("div", {}, w)); }
  document.querySelectorAll("#doctext .sel, #outline .sel").forEach((n) => n.classList.remove("sel"));
  document.querySelectorAll('#doctext [data-i="' + i + '"], #outline [data-i="' + i + '"]')
    .forEach((n) => n.classList.add("sel"));
}

function recordTable(rec) {
  const t = el("table", {class: "record"});
  for (const [k, v] of Object.entries(rec)) {
    const tr = el("tr");
    tr.appendChild(el("th", {}, k));
    tr.appendChild(el("td", {}, typeof v === "object" ? JSON.stringify(v) : fmt(v)));
    t.appendChild(tr);
  }
  return t;
}

function barRow(label, spans, n, cls, title) {
  const row = el("div", {class: "barrow " + (cls || "")});
  row.appendChild(el("div", {class: "barlabel", title: title || label}, label));
  const track = el("div", {class: "track"});
  spans.forEach((s, j) => {
    const seg = el("div", {class: "bar c" + (j % 2), title: (s[2] ? s[2] + " · " : "") + (s[1] - s[0]) + " chars"});
    seg.style.left = (100 * s[0] / n) + "%";
    seg.style.width = Math.max(0.15, 100 * (s[1] - s[0]) / n) + "%";
    track.appendChild(seg);
  });
  row.appendChild(track);
  return row;
}

function candidatesSection(d) {
  const box = el("section", {id: "candidates"});
  box.appendChild(el("h2", {}, "Candidates (" + d.cand.length + ")"));
  const cols = ["unit", "candidate", "selected", "clarity", "completeness", "rank_clarity", "rank_completeness",
    "rrf", "chunks", "fate"];
  const t = el("table", {class: "cands"});
  const head = el("tr");
  cols.forEach((c) => head.appendChild(el("th", {}, c)));
  t.appendChild(head);
  d.cand.forEach((c) => {
    const tr = el("tr", {class: c.selected ? "selected" : "", "data-candidate": c.candidate});
    cols.forEach((k) => {
      const v = k === "chunks" ? c.spans.length : k === "selected" ? (c.selected ? "★ selected" : "") :
        k === "fate" ? (c.excluded ? c.fate + " (" + c.excluded + ")" : c.fate) : c[k];
      tr.appendChild(el("td", {class: typeof v === "number" ? "num" : ""}, fmt(v)));
    });
    t.appendChild(tr);
  });
  box.appendChild(t);
  box.appendChild(el("p", {class: "muted"}, "Boundaries on one scale (the whole document): a vertical line " +
    "through the rows is the same character offset in every candidate."));
  const bars = el("div", {class: "bars"});
  const n = Math.max(1, d.text.length);
  bars.appendChild(barRow("memory", d.sc, n, "memory"));
  d.cand.forEach((c) => {
    const spans = c.spans.map((s, j) => [s[0], s[1], c.outline ? c.outline[j] : ""]);
    const label = (c.unit !== d.id ? c.unit.slice(d.id.length) + " " : "") + "cand " + c.candidate +
      (c.selected ? " ★" : "");
    bars.appendChild(barRow(label, spans, n, c.selected ? "selected" : ""));
  });
  if (d.gold) bars.appendChild(barRow("gold", goldSpans(d), n, "gold"));
  box.appendChild(bars);
  return box;
}

// The cut head's score at every allowed end, under the text: a tick per end, its height the probability of a topic
// change there; the ends that became grammar breaks (at or above the threshold) are drawn solid.
function cutStrip(d) {
  const n = Math.max(1, d.text.length), c = d.cuts, breaks = new Set(c.breaks || []);
  const wrap = el("div", {class: "cutscores"});
  wrap.appendChild(el("div", {class: "barlabel"}, "cut scores (threshold " + c.threshold + ", " + c.head + ")"));
  const strip = el("div", {class: "cutstrip"});
  c.ends.forEach((e, j) => {
    const tick = el("span", {class: "cuttick" + (breaks.has(e) ? " cutbreak" : ""), "data-end": e,
      title: "end at " + e + ": P(new topic) " + c.p[j] + (breaks.has(e) ? " (break)" : "")});
    tick.style.left = (100 * e / n) + "%";
    tick.style.height = Math.max(2, Math.round(40 * c.p[j])) + "px";
    strip.appendChild(tick);
  });
  wrap.appendChild(strip);
  return wrap;
}

function goldSpans(d) {
  const cuts = [0].concat(d.gold.boundaries, [d.text.length]);
  return cuts.slice(1).map((e, j) => [cuts[j], e, d.gold.titles ? d.gold.titles[j] : ""]);
}

function drawDoc(d) {
  const view = $("docview");
  view.replaceChildren();
  view.appendChild(el("h2", {id: "doctitle"}, d.id));
  view.appendChild(el("div", {class: "muted"}, d.text.length + " characters · " + d.sc.length + " chunks"));
  if (d.problems) {
    const box = el("div", {class: "problems bad", id: "problems"});
    box.appendChild(el("b", {}, "The spans do not tile the document (shown as written, not fixed):"));
    const ul = el("ul");
    d.problems.forEach((p) => ul.appendChild(el("li", {}, p)));
    box.appendChild(ul);
    view.appendChild(box);
  }
  if (d.gold_note) view.appendChild(el("div", {class: "warn"}, d.gold_note));
  const cols = el("div", {class: "cols"});
  const outline = el("ol", {id: "outline"});  // numbered from 1, as a reader counts
  d.sc.forEach((s, i) => {
    const li = el("li", {"data-i": i}, s[2] || "(no outline)");
    li.addEventListener("click", () => {
      const target = document.querySelector('#doctext .chunk[data-i="' + i + '"]');
      if (target) target.scrollIntoView({block: "center"});
      showChunk(d, i);
    });
    outline.appendChild(li);
  });
  const left = el("nav", {class: "outlinecol"});
  left.appendChild(el("h3", {}, "Outline"));
  left.appendChild(outline);
  const text = el("div", {id: "doctext", class: "text"});
  const golds = new Set(d.gold ? d.gold.boundaries : []);
  segments(d.text, d.sc).forEach((p) => {
    let node;
    if (p.kind === "gap") {
      node = el("mark", {class: "seg gap", title: "gap: " + (p.b - p.a) + " characters no chunk covers"},
        d.text.slice(p.a, p.b));
    } else {
      const s = d.sc[p.i];
      node = el("span", {class: "seg chunk c" + (p.i % 2), "data-i": p.i,
        title: s[2] + (s[3] ? "\n— " + s[3] : "")}, d.text.slice(p.a, p.b));
      if (p.overlap) { node.classList.add("overlap"); node.setAttribute("data-note", "overlaps by " + p.overlap); }
      node.addEventListener("mouseenter", () => showChunk(d, p.i));
    }
    if (golds.has(p.a)) text.appendChild(el("span", {class: "goldcut", title: "gold boundary at " + p.a}));
    text.appendChild(node);
  });
  const right = el("aside", {class: "infocol"});
  right.appendChild(el("div", {id: "chunkinfo"}, "Point at a chunk (or click an outline item) to see its core."));
  if (d.gen) { right.appendChild(el("h3", {}, "Generation record")); right.appendChild(recordTable(d.gen)); }
  if (d.reasoning) {
    const det = el("details");
    det.appendChild(el("summary", {}, "Reasoning path"));
    det.appendChild(el("div", {class: "text"}, d.reasoning));
    right.appendChild(det);
  }
  cols.append(left, text, right);
  view.appendChild(cols);
  if (d.cuts) view.appendChild(cutStrip(d));
  if (d.gold && !d.cand) {
    const bars = el("div", {class: "bars"});
    bars.appendChild(barRow("memory", d.sc, Math.max(1, d.text.length), "memory"));
    bars.appendChild(barRow("gold", goldSpans(d), Math.max(1, d.text.length), "gold"));
    view.appendChild(bars);
  }
  if (d.cand) view.appendChild(candidatesSection(d));
  document.querySelectorAll(".docitem.current").forEach((n) => n.classList.remove("current"));
  const item = document.querySelector('.docitem[data-i="' + DOCS.indexOf(d) + '"]');
  if (item) item.classList.add("current");
}

function route() {
  const m = /^#doc=(.*)$/.exec(location.hash);
  const id = m ? decodeURIComponent(m[1]) : null;
  const d = (id !== null && DOCS.find((x) => x.id === id)) || DOCS[0];
  if (d) drawDoc(d);
  document.body.setAttribute("data-rendered", d ? d.id : "");
}

$("search").addEventListener("input", drawList);
window.addEventListener("hashchange", route);
drawList();
route();
