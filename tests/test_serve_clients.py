"""`transformer serve` for the clients that exist (issue 45): a language under any of its standard
codes, texts of any length cut into sentences and joined back, HTML, /detect, alternatives,
fields from JSON, a form or the query string, LibreTranslate's /frontend/settings; driven by three
real LibreTranslate clients from PyPI and the page in Chromium. Every answer is checked against
the offline translation of each of its sentences alone."""
import asyncio
import html
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

aiohttp = pytest.importorskip("aiohttp", reason='needs the [serve] extra: pip install ".[serve]"')
pytest.importorskip("sentencex", reason='needs the [serve] extra: pip install ".[serve]"')

from test_serve import OUTSIDE, SMALL, WORDS, Running, _browser, offline, post  # noqa: E402
from transformer.checkpoint import load_for_inference  # noqa: E402
from transformer.languages import english_name, match, normalise  # noqa: E402
from transformer.serve import load_models  # noqa: E402
from transformer.train import text_pieces  # noqa: E402

FRENCH = ["le", "chat", "chien", "maison", "rouge", "bleu", "court", "dort", "grand", "petit", "arbre", "la"]
POSITIONS = 40                  # the English model's positions: a long sentence is cut to fit them


def _sentences(words, n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(n)]


def _train(root, header, words, *extra):
    """A model trained for seconds on pairs under `header` (the source's and target's names)."""
    data = root / "pairs.tsv"
    ends = ["", ".", "!", "?", ","]
    lines = [f"{s}{ends[i % 5]}\t{s[::-1].upper()}{ends[i % 5]}\n" for i, s in enumerate(_sentences(words, 300, 0))]
    data.write_text(header + "\n" + "".join(lines), encoding="utf-8")
    out = str(root / "model")
    src_col, tgt_col = header.split("\t")
    done = subprocess.run([sys.executable, "-m", "transformer", "train", "--data", str(data), "--src-col", src_col,
                           "--tgt-col", tgt_col, *SMALL,
                           "--vocab-size", "60", "--max-steps", "40", *extra, "--out", out],
                          capture_output=True, text=True, timeout=300, cwd=OUTSIDE)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    out = _train(tmp_path_factory.mktemp("en"), "eng\tspa", WORDS, "--max-sentence-tokens", str(POSITIONS))
    assert json.load(open(os.path.join(out, "languages.json"))) == {"source": "en", "target": "es"}
    return out


@pytest.fixture(scope="module")
def french(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("fr"), "fre\tspa", FRENCH)     # fre: ISO 639-2/B


@pytest.fixture(scope="module")
def server(english, french):
    running = Running("--model", english, "--model", french)
    yield running
    running.stop()


def alone(model_dir, sentences, **options):
    """Each sentence translated offline by itself."""
    return [offline(model_dir, [s], **options)[0] for s in sentences]


def translate(server, **fields):
    status, body, _ = post(server.url, "/translate", fields)
    assert status == 200, body
    return body


async def _get(url):
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as response:
            return response.status, await response.json()


# -- language codes --------------------------------------------------------------------------------

def test_every_standard_name_of_a_language_is_one_tag():
    names = {"en": "en", "eng": "en", "EN": "en", "en-US": "en-US", "spa": "es", "ger": "de", "deu": "de",
             "fre": "fr", "fra": "fr", "chi": "zh", "zh-hans": "zh-Hans", "pt-BR": "pt-BR", "por": "pt", "iw": "he"}
    assert {name: normalise(name) for name in names} == names
    assert [normalise(bad) for bad in ("English", "xx", "und", "", None, "e1")] == [None] * 6
    assert match("pt-BR", ["pt", "en"]) == "pt" and match("en-GB", ["en"]) == "en" and match("eng", ["en"]) == "en"
    assert match("zh-Hant", ["zh-Hans"]) is None and match("de", ["en", "es"]) is None
    assert english_name("pt-BR") == "Portuguese (Brazil)"


@pytest.mark.parametrize("source, target", [("en", "es"), ("eng", "spa"), ("EN", "ES"), ("en-US", "es-MX"),
                                            ("en_GB", "es-419")])
def test_a_served_language_answers_to_each_of_its_codes(server, english, source, target):
    assert translate(server, q="the big cat", source=source, target=target)["translatedText"] == \
        offline(english, ["the big cat"])[0]


def test_a_model_trained_before_the_codes_were_normalised_keeps_serving(english, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(english, old)
    (old / "languages.json").write_text('{"source": "eng", "target": "spa"}\n')
    served = load_models([str(old)], load=load_for_inference)
    assert list(served) == ["en-es"] and (served["en-es"].source, served["en-es"].target) == ("en", "es")


def test_languages_lists_every_served_language_as_libretranslate_does(server):
    status, body = asyncio.run(_get(server.url + "/languages"))
    assert status == 200 and body == [{"code": "en", "name": "English", "targets": ["es"]},
                                      {"code": "es", "name": "Spanish", "targets": []},
                                      {"code": "fr", "name": "French", "targets": ["es"]}]


# -- texts of any length ---------------------------------------------------------------------------

def test_a_paragraph_is_each_of_its_sentences_translated_alone_in_order(server, english):
    sentences = ["the big cat runs.", "a small dog sleeps!", "red tree?", "the house.", "blue dog runs."]
    text = f"{sentences[0]} {sentences[1]}  {sentences[2]}\n\n  {sentences[3]}\r\n{sentences[4]}\n"
    t = alone(english, sentences)
    assert translate(server, q=text, source="en", target="es")["translatedText"] == \
        f"{t[0]} {t[1]}  {t[2]}\n\n  {t[3]}\r\n{t[4]}\n"


def test_a_sentence_longer_than_the_models_positions_is_split_never_cut(server, english):
    long = ", ".join(["the big red cat runs"] * 12) + "."
    model, src_tok, _ = load_for_inference(english)
    pieces = text_pieces(model, src_tok, long)
    assert len(pieces) > 1 and sum(map(len, pieces)) == len(src_tok.encode(long))     # nothing dropped
    assert translate(server, q=long, source="en", target="es")["translatedText"] == offline(english, [long])[0]


def test_text_with_nothing_to_translate_comes_back_as_it_is(server):
    assert translate(server, q=["", "  \n", "...", "&"], source="en", target="es")["translatedText"] == \
        ["", "  \n", "...", "&"]


# -- HTML ------------------------------------------------------------------------------------------

def test_html_translates_the_text_of_elements_and_keeps_the_markup(server, english):
    markup = ('<!DOCTYPE html><p class="x" title="the cat">the big cat runs. a dog!<br>'
              '<b data-n="1">red tree</b> &amp; <code>the cat</code></p><!-- the dog -->'
              '<script>var s = "the cat <b>";</script><style>p { color: red }</style><pre>blue house</pre>'
              '<div translate="no">small tree <span translate="yes">the house</span></div>'
              '<p class="notranslate">big dog</p>&nbsp;the&nbsp;cat&nbsp;')
    t = [html.escape(s, quote=False) for s in alone(english, ["the big cat runs.", "a dog!", "red tree", "the house",
                                                              "the\u00a0cat"])]
    want = (f'<!DOCTYPE html><p class="x" title="the cat">{t[0]} {t[1]}<br>'
            f'<b data-n="1">{t[2]}</b> &amp; <code>the cat</code></p><!-- the dog -->'
            '<script>var s = "the cat <b>";</script><style>p { color: red }</style><pre>blue house</pre>'
            f'<div translate="no">small tree <span translate="yes">{t[3]}</span></div>'
            f'<p class="notranslate">big dog</p>&nbsp;{t[4].replace(chr(160), "&nbsp;")}&nbsp;')
    assert translate(server, q=markup, source="en", target="es", format="html")["translatedText"] == want


# -- detection, auto, alternatives -------------------------------------------------------------------

def test_detect_answers_in_libretranslates_shape_among_the_served_sources(server):
    for text, language in (("the big cat runs and the small dog sleeps", "en"),
                           ("le grand chat rouge dort dans la maison", "fr")):
        status, body, _ = post(server.url, "/detect", {"q": text})
        assert status == 200 and body[0]["language"] == language, body
        assert all(set(d) == {"confidence", "language"} and d["language"] in ("en", "fr") for d in body)
        assert isinstance(body[0]["confidence"], float) and 50 < body[0]["confidence"] <= 100
    status, body, _ = post(server.url, "/detect", {})
    assert status == 400 and "missing field q" in body["error"]


def test_source_auto_detects_each_texts_language_and_says_so(server, english, french):
    en, fr = "the big cat runs and the small dog sleeps", "le grand chat rouge dort dans la maison"
    body = translate(server, q=[en, fr], source="auto", target="es")
    assert body["translatedText"] == [offline(english, [en])[0], offline(french, [fr])[0]]
    assert [d["language"] for d in body["detectedLanguage"]] == ["en", "fr"]
    single = translate(server, q=fr, source="auto", target="es")
    assert single["detectedLanguage"]["language"] == "fr" and single["detectedLanguage"]["confidence"] > 50


def test_alternatives_are_the_beams_other_translations(server, english):
    served = load_models([english], load=load_for_inference)["en-es"]
    text = "the big cat runs"
    hypotheses = served.decode(text_pieces(served.model, served.src_tokenizer, text), 4, None, 0,
                               served.defaults["precision"], alternatives=3)[0]
    others = list(dict.fromkeys(h for h in hypotheses[1:] if h and h != hypotheses[0]))
    body = translate(server, q=text, source="en", target="es", alternatives=3)
    assert body["translatedText"] == hypotheses[0] == offline(english, [text])[0]    # the best: unchanged
    assert body["alternatives"] == others and len(others) >= 1
    assert translate(server, q=[text], source="en", target="es", alternatives=1)["alternatives"] == [others[:1]]
    assert translate(server, q="<b>a</b>", source="en", target="es", format="html", alternatives=2)["alternatives"] == []
    assert "alternatives" not in translate(server, q=text, source="en", target="es")


# -- fields, keys, settings ----------------------------------------------------------------------------

def test_fields_come_from_the_query_string_or_a_form_and_an_unneeded_key_is_ignored(server, english):
    async def go():
        async with aiohttp.ClientSession() as session:
            query = {"q": "a red tree", "source": "en", "target": "es", "format": "text", "api_key": "whatever"}
            async with session.post(server.url + "/translate", params=query) as r:
                by_query = r.status, await r.json()
            async with session.post(server.url + "/translate", data={**query, "q": "blue house"}) as r:
                by_form = r.status, await r.json()
            return by_query, by_form
    by_query, by_form = asyncio.run(go())
    assert by_query == (200, {"translatedText": offline(english, ["a red tree"])[0]})
    assert by_form == (200, {"translatedText": offline(english, ["blue house"])[0]})


def test_frontend_settings_answer_as_libretranslates(server):
    status, body = asyncio.run(_get(server.url + "/frontend/settings"))
    assert status == 200
    assert body == {"charLimit": 5000, "frontendTimeout": 500, "apiKeys": False, "keyRequired": False,
                    "suggestions": False, "filesTranslation": True,
                    "supportedFilesFormat": [".txt", ".srt", ".vtt", ".html", ".htm", ".docx", ".pptx", ".odt",
                                             ".epub"],
                    "language": {"source": {"code": "auto", "name": "Auto Detect"},
                                 "target": {"code": "es", "name": "Spanish"}}}


# -- real clients --------------------------------------------------------------------------------------

PARAGRAPH = ["the big cat runs.", "a small dog sleeps.", "red tree!"]
MARKUP = "<p>the big cat runs. <b>a small dog</b></p>"


def test_libretranslatepy(server, english):
    libretranslatepy = pytest.importorskip("libretranslatepy")
    client = libretranslatepy.LibreTranslateAPI(server.url + "/")
    t = alone(english, PARAGRAPH)
    assert client.translate(" ".join(PARAGRAPH), "en", "es") == " ".join(t)
    # it sends no format: the markup is text, as LibreTranslate reads it
    assert client.translate(MARKUP, "en", "es") == _as_text(english, MARKUP)
    assert client.detect("le grand chat rouge dort dans la maison")[0]["language"] == "fr"
    assert [language["code"] for language in client.languages()] == ["en", "es", "fr"]


def test_deep_translator(server, english):
    libre = pytest.importorskip("deep_translator").LibreTranslator
    # deep-translator needs a key to start and posts every field in the query string, key included
    translator = libre(source="en", target="es", api_key="not-needed", custom_url=server.url + "/")
    assert translator.translate(" ".join(PARAGRAPH)) == " ".join(alone(english, PARAGRAPH))
    assert translator.translate_batch(PARAGRAPH) == alone(english, PARAGRAPH)
    assert translator.translate(MARKUP) == _as_text(english, MARKUP)


def test_libretranslate_aio(server, english, french):
    lt = pytest.importorskip("libretranslate_aio")
    with lt.LibreTranslate(server.url) as client:
        t = alone(english, PARAGRAPH)
        assert client.translate(" ".join(PARAGRAPH), "en", "es").translated_text == " ".join(t)
        answer = client.translate(MARKUP, "en", "es", format="html")
        a, b = alone(english, ["the big cat runs.", "a small dog"])
        assert answer.translated_text == f"<p>{html.escape(a, quote=False)} <b>{html.escape(b, quote=False)}</b></p>"
        both = client.translate([PARAGRAPH[0], "le chat dort dans la maison rouge"], "auto", "es")
        assert both.translated_text == [t[0], offline(french, ["le chat dort dans la maison rouge"])[0]]
        assert [d.language for d in both.detected_language] == ["en", "fr"]
        assert client.translate("the big cat runs", "en", "es", alternatives=2).alternatives
        assert client.detect("the big cat runs and the small dog sleeps")[0].language == "en"
        assert client.frontend_settings().key_required is False and client.health()
        assert {language.code for language in client.languages()} == {"en", "es", "fr"}


def _as_text(model_dir, text):
    """What the server answers for `text` as format "text": each of its sentences alone."""
    from transformer.serve.documents import translate_documents
    return translate_documents([text], "en", lambda sentences: alone(model_dir, sentences))[0]


# -- the page ------------------------------------------------------------------------------------------

def test_the_page_translates_a_paragraph_sentence_by_sentence(server, english):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _browser()
    try:
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#model option"))
        browser.find_element(By.ID, "text").send_keys(" ".join(PARAGRAPH))
        browser.find_element(By.ID, "go").click()
        WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".sentence"))
        shown = [(box.find_element(By.CSS_SELECTOR, ".source-line").text,
                  box.find_element(By.CSS_SELECTOR, ".translation").text)
                 for box in browser.find_elements(By.CSS_SELECTOR, ".sentence")]
    finally:
        browser.quit()
    assert shown == list(zip(PARAGRAPH, alone(english, PARAGRAPH)))


def test_the_page_translates_a_file_into_a_download_link(server, english, tmp_path):
    """The page's file picker: a .txt sent to /translate_file with the chosen model's languages, the
    answer offered as a link whose file is byte for byte `transformer translate --file`'s."""
    import urllib.request

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    source = tmp_path / "story.txt"
    source.write_text("\n".join(PARAGRAPH[:2]) + "\n\n  " + PARAGRAPH[-1] + "\n", encoding="utf-8")
    want = tmp_path / "story.es.txt"
    done = subprocess.run([sys.executable, "-m", "transformer", "translate", "--model", english, "--threads", "1",
                           "--file", str(source), "--out", str(want)], capture_output=True, text=True, timeout=120,
                          cwd=OUTSIDE)
    assert done.returncode == 0, done.stderr
    browser = _browser()
    try:
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#model option"))
        # the first model served is the English one: its languages go with the file
        assert browser.execute_script('return $("model").selectedOptions[0].textContent').endswith("(en \u2192 es)")
        browser.find_element(By.ID, "file").send_keys(str(source))
        browser.find_element(By.ID, "go-file").click()
        WebDriverWait(browser, 60).until(lambda b: b.find_element(By.ID, "file-link").is_displayed()
                                         or "error" in b.find_element(By.ID, "file-status").get_attribute("class"))
        status = browser.find_element(By.ID, "file-status").text
        link = browser.find_element(By.ID, "file-link")
        href, download = link.get_attribute("href"), link.get_attribute("download")
    finally:
        browser.quit()
    assert href and href.startswith(server.url + "/download_file/"), status
    assert download == "story.es.txt"
    with urllib.request.urlopen(href, timeout=30) as response:
        assert response.read() == want.read_bytes()
