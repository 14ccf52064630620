// The page of `transformer serve`: no framework, no network but this server (it works offline).
"use strict";

const $ = (id) => document.getElementById(id);
let served = [];

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

// Subword pieces as words: SentencePiece's and our BPE's word-start mark shown as a space.
function piece(token) {
  return token.replace(/\u2581/g, " ").trim() || token;
}

// A weight as a blue, darkest for the largest weight of its row (the word attended to most).
function shade(weight, rowMax) {
  const share = rowMax > 0 ? Math.min(Math.max(weight / rowMax, 0), 1) : 0;
  return `hsl(214, 70%, ${Math.round(97 - 55 * share)}%)`;
}

async function loadModels() {
  const health = await (await fetch("health")).json();
  served = health.models;
  $("model").innerHTML = "";
  for (const m of served) {
    const option = document.createElement("option");
    option.value = m.name;
    option.textContent = `${m.name} (${m.source} \u2192 ${m.target})`;
    $("model").appendChild(option);
  }
  $("beam").value = served.length ? served[0].beam : 4;
  $("key-label").hidden = !health.api_keys;
}

// One sentence: the source, the translation, its tokens (hover or click one: its attention over the
// source words), and the heatmap, one row per output token and one column per source token.
function renderSentence(source, sentence) {
  const box = document.createElement("div");
  box.className = "sentence";
  const src = document.createElement("p");
  src.className = "source-line";
  src.textContent = source;
  const out = document.createElement("p");
  out.className = "translation";
  out.textContent = sentence.text;
  const score = document.createElement("p");
  score.className = "score";
  score.textContent = `log-probability ${sentence.log_prob.toFixed(3)} (${sentence.score.toFixed(3)} a token)`;
  const sourceTokens = document.createElement("div");
  sourceTokens.className = "tokens source-tokens";
  const sourceSpans = sentence.source_tokens.map((token) => {
    const span = document.createElement("span");
    span.className = "token";
    span.textContent = piece(token);
    sourceTokens.appendChild(span);
    return span;
  });
  const targetTokens = document.createElement("div");
  targetTokens.className = "tokens target-tokens";
  const table = document.createElement("table");
  table.className = "heatmap";
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  for (const token of sentence.source_tokens) {
    const th = document.createElement("th");
    th.textContent = piece(token);
    head.appendChild(th);
  }
  const body = table.createTBody();
  let pinned = null;
  const show = (row) => {
    const weights = row === null ? null : sentence.attention[row];
    const top = weights ? Math.max(...weights) : 0;
    sourceSpans.forEach((span, j) => { span.style.background = weights ? shade(weights[j], top) : ""; });
    Array.from(body.rows).forEach((tr, i) => tr.classList.toggle("active", i === row));
  };
  sentence.target_tokens.forEach((token, i) => {
    const span = document.createElement("span");
    span.className = "token";
    span.textContent = piece(token);
    span.addEventListener("mouseenter", () => show(i));
    span.addEventListener("mouseleave", () => show(pinned));
    span.addEventListener("click", () => {
      pinned = pinned === i ? null : i;
      targetTokens.querySelectorAll(".token").forEach((s, k) => s.classList.toggle("pinned", k === pinned));
      show(pinned);
    });
    targetTokens.appendChild(span);
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = piece(token);
    tr.appendChild(th);
    const rowMax = Math.max(...sentence.attention[i]);
    sentence.attention[i].forEach((weight) => {
      const td = tr.insertCell();
      td.style.background = shade(weight, rowMax);
      td.title = weight.toFixed(3);
    });
    tr.addEventListener("mouseenter", () => show(i));
    tr.addEventListener("mouseleave", () => show(pinned));
  });
  box.append(src, out, score, sourceTokens, targetTokens, table);
  return box;
}

async function translate(event) {
  if (event) event.preventDefault();
  const lines = $("text").value.split("\n").filter((line) => line.trim());
  if (!lines.length) { setStatus("nothing to translate", true); return; }
  const body = {q: lines, model: $("model").value, beam: Number($("beam").value), scores: true, attention: true};
  if ($("key").value) body.api_key = $("key").value;
  setStatus("translating\u2026");
  $("go").disabled = true;
  const started = performance.now();
  try {
    const response = await fetch("v1/translate", {method: "POST", headers: {"Content-Type": "application/json"},
                                                  body: JSON.stringify(body)});
    const answer = await response.json();
    if (!response.ok) { setStatus(answer.error || `error ${response.status}`, true); return; }
    $("output").innerHTML = "";
    answer.translations.forEach((translation, i) => {
      // a line of several sentences: each sentence apart, with its own source (the server's split)
      translation.sentences.forEach((sentence) => $("output").appendChild(renderSentence(sentence.source || lines[i], sentence)));
    });
    setStatus(`${lines.length} line${lines.length > 1 ? "s" : ""} in ${Math.round(performance.now() - started)} ms`);
  } catch (error) {
    setStatus(`the server did not answer (${error})`, true);
  } finally {
    $("go").disabled = false;
  }
}

// A file goes whole to LibreTranslate's /translate_file, with the chosen model's languages: the server
// keeps its layout and answers with a link to the translated file, which is offered for download.
async function translateFile(event) {
  if (event) event.preventDefault();
  const file = $("file").files[0];
  const model = served.find((m) => m.name === $("model").value);
  const status = (text, isError) => {
    $("file-status").textContent = text;
    $("file-status").className = isError ? "error" : "";
  };
  if (!file) { status("choose a file first", true); return; }
  if (!model) { status("no model is served", true); return; }
  const form = new FormData();
  form.append("file", file, file.name);
  form.append("source", model.source);
  form.append("target", model.target);
  form.append("model", model.name);
  if ($("key").value) form.append("api_key", $("key").value);
  $("file-link").hidden = true;
  $("go-file").disabled = true;
  status(`translating ${file.name}\u2026`);
  const started = performance.now();
  try {
    const response = await fetch("translate_file", {method: "POST", body: form});
    const answer = await response.json();
    if (!response.ok) { status(answer.error || `error ${response.status}`, true); return; }
    // the server's name is a token, the language and the original name: offer the original's name
    const dot = file.name.lastIndexOf(".");
    const stem = dot > 0 ? file.name.slice(0, dot) : file.name;
    $("file-link").href = answer.translatedFileUrl;
    $("file-link").download = `${stem}.${model.target}${dot > 0 ? file.name.slice(dot) : ""}`;
    $("file-link").textContent = `download ${$("file-link").download}`;
    $("file-link").hidden = false;
    status(`translated in ${Math.round(performance.now() - started)} ms`);
  } catch (error) {
    status(`the server did not answer (${error})`, true);
  } finally {
    $("go-file").disabled = false;
  }
}

$("form").addEventListener("submit", translate);
$("file-form").addEventListener("submit", translateFile);
$("text").addEventListener("keydown", (event) => { if (event.key === "Enter" && event.ctrlKey) translate(event); });
loadModels().catch((error) => setStatus(`cannot reach the server (${error})`, true));
