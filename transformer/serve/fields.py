"""Reading a request as LibreTranslate reads it: its fields from a JSON body, or else from the query
string and a form together (deep-translator posts every field as a query parameter, with an
api_key even when none is needed); q and the other fields checked against the limits, each
refusal naming the field."""
import json

FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


class BadRequest(ValueError):
    """A request the server will not take: HTTP `status` with LibreTranslate's {"error": ...}."""

    def __init__(self, message, status=400, headers=None):
        super().__init__(message)
        self.status, self.headers = status, headers


class Limits:
    """What one request may hold (each refused with the limit named)."""

    def __init__(self, char_limit=5000, max_texts=64, max_body=1 << 20):
        self.char_limit, self.max_texts, self.max_body = char_limit, max_texts, max_body


def _multi(pairs, into):
    """A form's or query's fields into `into`: the last value of each, and every value of q when
    it is given more than once (a list of texts, as libretranslate-aio sends one)."""
    for key in pairs:
        values = pairs.getall(key)
        into[key] = values if key == "q" and len(values) > 1 else values[-1]


async def read_fields(request, json_only=False):
    """The request's fields: a JSON object (application/json), or the query string's and a form's
    (LibreTranslate's request.values: the query string wins a field given in both)."""
    kind = request.content_type
    if kind == "application/json" or json_only:
        try:
            body = await request.read()
            data = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError:
            raise BadRequest("the request body is not valid UTF-8") from None
        except ValueError as exc:
            raise BadRequest(f"the request body is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise BadRequest("the request body must be a JSON object")
        return data
    data = {}
    if kind in FORMS:
        try:
            _multi(await request.post(), data)
        except UnicodeDecodeError:
            raise BadRequest("the form is not valid UTF-8") from None
    elif request.can_read_body and await request.content.read(1):
        raise BadRequest(f"unsupported Content-Type {kind!r}: send application/json, a form or the query string")
    try:
        _multi(request.query, data)
    except UnicodeDecodeError:
        raise BadRequest("the query string is not valid UTF-8") from None
    return data


def texts_of(fields, limits):
    """(texts, was_list) from the field q, within the limits."""
    if "q" not in fields:
        raise BadRequest("missing field q (the text to translate)")
    q = fields["q"]
    was_list = isinstance(q, list)
    texts = q if was_list else [q]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            where = f"q[{i}]" if was_list else "q"
            raise BadRequest(f"{where} must be a string, got {type(text).__name__}")
    if len(texts) > limits.max_texts:
        raise BadRequest(f"q holds {len(texts)} texts; at most {limits.max_texts} a request (--max-texts)")
    chars = sum(len(text) for text in texts)
    if limits.char_limit and chars > limits.char_limit:
        raise BadRequest(f"q holds {chars} characters; at most {limits.char_limit} a request (--char-limit)")
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
    value = fields.get("format") or "text"
    if value not in ("text", "html"):
        raise BadRequest(f"{value} format is not supported (format: text or html)")
    return value
