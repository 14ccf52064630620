"""Reading a request as LibreTranslate reads it: its fields from a JSON body, or else from the query
string and a form together (deep-translator posts every field as a query parameter, with an
api_key even when none is needed); q and the other fields checked against the limits, each
refusal naming the field.

Whatever a client sends is read in time linear in its size, and anything that is not a request
(JSON nested past what the reader can follow, a field given twice, a lone surrogate or a NUL
character, a language code longer than any language's) is a 400 naming the field, never a 500;
an error message shows at most a few dozen characters of what was sent."""
import asyncio
import json

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")
# The longest language code a request may name (a BCP-47 tag with script, region and variants is
# far shorter): the language tables cache what they are asked, so a longer one is refused, not kept.
MAX_CODE = 64
SHOWN = 40                      # characters of a client's value an error message repeats, at most


class BadRequest(ValueError):
    """A request the server will not take: HTTP `status` with LibreTranslate's {"error": ...}."""

    def __init__(self, message, status=400, headers=None):
        super().__init__(message)
        self.status, self.headers = status, headers


class Limits:
    """What one request may hold (each refused with the limit named)."""

    def __init__(self, char_limit=5000, max_texts=64, max_body=1 << 20, body_timeout=30.0, header_timeout=10.0,
                 max_connections=1000, req_limit=0, chars_per_minute=0, max_file_size=1 << 20, file_expiry=1800.0):
        self.char_limit, self.max_texts, self.max_body = char_limit, max_texts, max_body
        self.body_timeout = body_timeout          # seconds to read a body, once its headers came
        self.header_timeout = header_timeout      # seconds for a request's headers (connections.py)
        self.max_connections = max_connections    # connections open at once (connections.py)
        self.req_limit, self.chars_per_minute = req_limit, chars_per_minute   # a minute, per client (limits.py)
        self.max_file_size = max_file_size        # bytes of a file to translate (POST /translate_file)
        self.file_expiry = file_expiry            # seconds a translated file waits to be downloaded (files.py)


def shown(value):
    """A client's value as an error message repeats it: its repr, cut to SHOWN characters."""
    text = repr(value) if not isinstance(value, (list, dict)) else type(value).__name__
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def field_name(key):
    """A field's name as an error message names it: as it is, or shown() when long or unprintable."""
    return key if isinstance(key, str) and len(key) <= SHOWN and key.isprintable() else shown(key)


def _multi(pairs, into, where):
    """A form's or query's fields into `into`, in one pass over them: every value of q when it is
    given more than once (a list of texts, as libretranslate-aio sends one); any other field given
    twice is refused (which one was meant?)."""
    for key, value in pairs.items():
        if key not in into:
            into[key] = value
        elif key == "q":
            if not isinstance(into[key], list):
                into[key] = [into[key]]
            into[key].append(value)
        else:
            raise BadRequest(f"field {field_name(key)} is given more than once in the {where}")


def _object(pairs):
    """json.loads' object_pairs_hook: a JSON object, a key given twice refused."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise BadRequest(f"field {field_name(key)} is given more than once in the JSON body")
        out[key] = value
    return out


def _add_query(request, fields):
    """The query string's fields over `fields` (they win, as in a form), then every value checked
    (check_text)."""
    try:
        query = {}
        _multi(request.query, query, "query string")
    except UnicodeDecodeError:
        raise BadRequest("the query string is not valid UTF-8") from None
    fields.update(query)
    check_text(fields)


async def _within(limits, read):
    """await read(), or 408 once the body has taken body_timeout seconds (a client that sends a
    byte now and then holds a connection and a handler)."""
    try:
        return await asyncio.wait_for(read, limits.body_timeout) if limits.body_timeout else await read
    except asyncio.TimeoutError:
        raise BadRequest(f"the request body took longer than {limits.body_timeout:g} s to arrive "
                         "(--body-timeout)", 408, {"Connection": "close"}) from None


# aiohttp's ways of refusing a body it cannot decode: a Content-Encoding whose data is not that
# encoding (RequestPayloadError), an unknown charset (LookupError), a multipart body without a
# boundary (ValueError), a part with a header given twice or malformed (BadHttpMessage), an unknown
# Content-Transfer-Encoding (RuntimeError)
UNREADABLE = (ValueError, LookupError, RuntimeError, AssertionError, HttpProcessingError, web.RequestPayloadError)


async def _body(limits, read, what):
    """_within(limits, read), a body aiohttp cannot decode refused as a 400 naming `what`."""
    try:
        return await _within(limits, read)
    except (BadRequest, UnicodeDecodeError):
        raise
    except UNREADABLE as exc:
        raise BadRequest(f"the {what} cannot be read ({' '.join(str(exc).split())[:80]})") from None


async def read_fields(request, limits, json_only=False):
    """The request's fields: a JSON object (application/json), or the query string's and a form's
    (LibreTranslate's request.values: the query string wins a field given in both)."""
    kind = request.content_type
    if kind == "application/json" or json_only:
        body = await _body(limits, request.read(), "request body")
        try:
            data = json.loads(body.decode("utf-8"), object_pairs_hook=_object)
        except UnicodeDecodeError:
            raise BadRequest("the request body is not valid UTF-8") from None
        except RecursionError:
            raise BadRequest("the request body nests JSON deeper than the server reads") from None
        except ValueError as exc:
            if isinstance(exc, BadRequest):
                raise
            raise BadRequest(f"the request body is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise BadRequest("the request body must be a JSON object")
        check_text(data)
        return data
    data = {}
    if kind in FORMS:
        try:
            form = await _body(limits, request.post(), "form")
            _multi(form, data, "form")
        except UnicodeDecodeError:
            raise BadRequest("the form is not valid UTF-8") from None
    elif request.can_read_body and await _body(limits, request.content.read(1), "request body"):
        raise BadRequest(f"unsupported Content-Type {shown(kind)}: send application/json, a form or the query string")
    _add_query(request, data)
    return data


def check_text(fields):
    """Every string of the fields (and of their lists) is text: no lone surrogate (JSON's \\ud800
    decodes to one; nothing can encode it) and no NUL character (no text holds one; C code and
    logs take it for an end)."""
    for key, value in fields.items():
        if not isinstance(key, str):
            continue
        values = value if isinstance(value, list) else (value,)
        for i, item in enumerate(values):
            if not isinstance(item, str):
                continue
            where = f"{key}[{i}]" if isinstance(value, list) else key
            if "\x00" in item:
                raise BadRequest(f"{field_name(where)} holds a NUL character")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{field_name(where)} is not valid Unicode (a lone surrogate)") from None


def language_of(fields, field):
    """The language code of `field` (source or target) as given: a non-empty string of at most
    MAX_CODE characters."""
    value = fields.get(field)
    if value is None or value == "":
        raise BadRequest(f"missing field {field} (a language code{' or auto' if field == 'source' else ''})")
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string (a language code), got {type(value).__name__}")
    if len(value) > MAX_CODE:
        raise BadRequest(f"{field} is {len(value)} characters long: a language code has at most {MAX_CODE}")
    return value


def texts_of(fields, limits, char_limit=None):
    """(texts, was_list) from the field q, within the limits (char_limit: in place of the limits')."""
    if "q" not in fields:
        raise BadRequest("missing field q (the text to translate)")
    q = fields["q"]
    was_list = isinstance(q, list)
    texts = q if was_list else [q]
    if not texts:
        raise BadRequest("q is an empty list: give at least one text")
    if len(texts) > limits.max_texts:
        raise BadRequest(f"q holds {len(texts)} texts; at most {limits.max_texts} a request (--max-texts)")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            where = f"q[{i}]" if was_list else "q"
            raise BadRequest(f"{where} must be a string, got {type(text).__name__}")
    chars = sum(len(text) for text in texts)
    char_limit = limits.char_limit if char_limit is None else char_limit
    if char_limit and chars > char_limit:
        raise BadRequest(f"q holds {chars} characters; at most {char_limit} a request (--char-limit)")
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"q{f'[{i}]' if was_list else ''} is not valid Unicode") from None
    return texts, was_list


def alternatives_of(fields):
    """LibreTranslate's alternatives: how many other translations to give (a number; below 0 is 0)."""
    value = fields.get("alternatives", 0)
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise BadRequest("Invalid request: alternatives parameter is not a number")
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        raise BadRequest("Invalid request: alternatives parameter is not a number") from None


def format_of(fields):
    """LibreTranslate's format: "text" (the default) or "html"."""
    value = fields.get("format")
    if value is None or value == "":
        return "text"
    if not isinstance(value, str) or value not in ("text", "html"):     # 0, false, [] are not "text"
        raise BadRequest(f"{value if isinstance(value, str) and len(value) <= SHOWN else shown(value)} format is "
                         "not supported (format: text or html)")
    return value


MAX_FIELD = 4096                # bytes of a /translate_file field other than the file
MAX_PARTS = 32                  # fields of its form, the file included (a client sends 3 to 5)


async def read_upload(request, limits):
    """POST /translate_file's multipart form: (fields, (file name, its bytes)). The file is read
    in chunks and refused (413) past limits.max_file_size, whatever --max-body says; the other
    fields are short text (MAX_FIELD bytes), each given once, at most MAX_PARTS of them; the query
    string adds its fields as for /translate."""
    missing = "Invalid request: missing file parameter (a multipart field file, with a file name)"
    if request.content_type == "application/x-www-form-urlencoded":
        raise BadRequest(missing)            # a form without a file is sent this way
    if request.content_type != "multipart/form-data":
        raise BadRequest(f"send the file as multipart/form-data (fields file, source, target), not "
                         f"{shown(request.content_type)}")

    async def read():
        fields, upload, parts = {}, None, 0
        reader = await request.multipart()
        while True:
            part = await reader.next()
            if part is None:
                break
            parts += 1
            if parts > MAX_PARTS:       # --max-body does not bound a multipart body: this does
                raise BadRequest(f"the form has more than {MAX_PARTS} fields (file, source, target, api_key ...)")
            name = getattr(part, "name", None)
            if name is None or not hasattr(part, "read_chunk"):
                raise BadRequest("a part of the form has no field name")
            if name in fields or (name == "file" and upload is not None):
                raise BadRequest(f"field {field_name(name)} is given more than once in the form")
            limit = limits.max_file_size if name == "file" else MAX_FIELD
            data = bytearray()
            while True:
                chunk = await part.read_chunk(65536)
                if not chunk:
                    break
                data += chunk
                if len(data) > limit:
                    if name == "file":
                        raise BadRequest(f"the file is larger than the limit of {limits.max_file_size} bytes "
                                         "(--max-file-size)", 413, {"Connection": "close"})
                    raise BadRequest(f"field {field_name(name)} is longer than {MAX_FIELD} bytes")
            if name == "file":
                upload = (part.filename, bytes(data))
            else:
                try:
                    fields[name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise BadRequest(f"field {field_name(name)} is not valid UTF-8") from None
        return fields, upload

    fields, upload = await _body(limits, read(), "multipart body")
    _add_query(request, fields)
    if upload is None:
        raise BadRequest(missing)
    if not upload[0]:
        raise BadRequest("the field file has no file name: its extension says its format")
    if "\x00" in upload[0] or len(upload[0]) > 255:
        raise BadRequest(f"the file name {shown(upload[0])} is not a file name")
    return fields, upload
