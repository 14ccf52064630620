"""Translation quality for equal wall-clock time: ours against the PyTorch reference network.

Both engines go through the same pipeline (transformer.train.train_on_data): the same split, BPE
vocabularies, length batches, Adam with the warm-up schedule, label smoothing and gradient
clipping; the same initial weights. Only the forward/backward/update of a step differs. The
PyTorch model is evaluated by copying its weights into our model and decoding with our decoder,
so BLEU and chrF compare what training reached, nothing else.

    python benchmarks/quality.py --engine ours|torch --data FILE --src-col eng --tgt-col hin \\
        --minutes 10 --threads 2 [--preset small]
"""
import sys

import numpy as np

from ..model import Seq2SeqTransformer


class TorchEngine:
    """Our model's training interface over the PyTorch reference network (torch_compat)."""

    def __init__(self, cfg, seed=0):
        import torch

        from ..torch_compat import to_torch

        torch.manual_seed(seed)
        self.cfg = cfg
        self.seed = seed
        self.ours = Seq2SeqTransformer(cfg, seed=seed)     # the same initial weights as ours
        self.net = to_torch(self.ours)
        self._synced = True

    def num_parameters(self):
        return self.ours.num_parameters()

    def zero_grad(self):
        for p in self.net.parameters():
            p.grad = None

    def forward_backward(self, src, tgt_in, tgt_out, label_smoothing=0.1):
        from ..torch_compat import torch_loss

        self.net.train()
        loss = torch_loss(self.net, src, tgt_in, tgt_out, label_smoothing)
        loss.backward()
        self._synced = False
        return float(loss.item())

    def _sync(self):
        if not self._synced:
            from ..torch_compat import torch_state_dict_numpy

            names = set(self.ours.params.data)
            self.ours.load_state_dict({k: v for k, v in torch_state_dict_numpy(self.net).items() if k in names})
            self._synced = True
        return self.ours

    def forward(self, src, tgt_in):
        return self._sync().forward(src, tgt_in)

    def greedy_decode(self, *args, **kwargs):
        return self._sync().greedy_decode(*args, **kwargs)

    def beam_search(self, *args, **kwargs):
        return self._sync().beam_search(*args, **kwargs)


class TorchAdam:
    """torch.optim.Adam with the paper's betas and eps; lr set per step like ours."""

    def __init__(self, engine):
        import torch

        self.opt = torch.optim.Adam(engine.net.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)

    def step(self, lr):
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()


def torch_clip(engine, max_norm):
    import torch

    return float(torch.nn.utils.clip_grad_norm_(engine.net.parameters(), max_norm))


def torch_engine(seed):
    def make(cfg):
        engine = TorchEngine(cfg, seed)
        return engine, TorchAdam(engine), torch_clip
    return make


def main(argv=None):
    from .. import cli, train

    argv = list(sys.argv[1:] if argv is None else argv)
    engine = "ours"
    if "--engine" in argv:
        i = argv.index("--engine")
        engine = argv[i + 1]
        del argv[i:i + 2]
    if engine not in ("ours", "torch"):
        raise SystemExit("--engine must be ours or torch")
    args = cli.build_parser().parse_args(["train", *argv])
    if not args.data:
        raise SystemExit("--data is required")
    if args.threads:
        import transformer as T

        T.set_num_threads(args.threads)
        if engine == "torch":
            import torch

            torch.set_num_threads(args.threads)
    train.load_resume(args)
    train.apply_defaults(args)            # the defaults a user gets with --data
    train.prepare_out_dir(args)
    np.seterr(all="ignore")
    print(f"engine: {engine}", file=sys.stderr)
    return train.train_on_data(args, engine=None if engine == "ours" else torch_engine(args.seed))


if __name__ == "__main__":
    sys.exit(main())
