"""Counters for GET /metrics, in Prometheus' text exposition format (no client library needed)."""
import threading

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Histogram:
    def __init__(self, buckets):
        self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, value):
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name, labels=""):
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{bound}"}} {n}' for bound, n in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum:.6f}" if labels else f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count{{{labels}}} {self.count}" if labels else f"{name}_count {self.count}")
        return out


class Metrics:
    """What the server counts; every method is safe from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests = {}            # (endpoint, status) -> count
        self.sentences = 0
        self.queue_length = 0
        self.batch_sizes = _Histogram(BATCH_BUCKETS)
        self.batch_seconds = _Histogram(LATENCY_BUCKETS)
        self.latency = {}             # endpoint -> _Histogram of request seconds

    def request(self, endpoint, status, seconds, sentences=0):
        with self._lock:
            self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1
            self.sentences += sentences
            self.latency.setdefault(endpoint, _Histogram(LATENCY_BUCKETS)).observe(seconds)

    def queued(self, length):
        with self._lock:
            self.queue_length = length

    def batch(self, size, seconds):
        with self._lock:
            self.batch_sizes.observe(size)
            self.batch_seconds.observe(seconds)

    def text(self):
        with self._lock:
            lines = ["# HELP transformer_requests_total HTTP requests answered, by endpoint and status.",
                     "# TYPE transformer_requests_total counter"]
            lines += [f'transformer_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]
            lines += ["# HELP transformer_sentences_total Sentences translated.",
                      "# TYPE transformer_sentences_total counter", f"transformer_sentences_total {self.sentences}",
                      "# HELP transformer_queue_length Sentences waiting to be decoded.",
                      "# TYPE transformer_queue_length gauge", f"transformer_queue_length {self.queue_length}",
                      "# HELP transformer_batch_size Sentences decoded together.",
                      "# TYPE transformer_batch_size histogram", *self.batch_sizes.lines("transformer_batch_size"),
                      "# HELP transformer_batch_seconds Seconds a batch took to decode.",
                      "# TYPE transformer_batch_seconds histogram",
                      *self.batch_seconds.lines("transformer_batch_seconds"),
                      "# HELP transformer_request_seconds Seconds from a request's arrival to its answer.",
                      "# TYPE transformer_request_seconds histogram"]
            for endpoint, histogram in sorted(self.latency.items()):
                lines += histogram.lines("transformer_request_seconds", f'endpoint="{endpoint}"')
            return "\n".join(lines) + "\n"
