"""Training: the public face of transformer.training, where each part has a room of its own
(the loop, the learning-rate schedule, the flags and their defaults, resume rules, corpus
preparation, data parallel, the built-in task), and of transformer.translation (text in, text
out), which the trainer's evaluation shares with `translate` and the server.

Every source of randomness is a function of (seed, step) or of state stored in the checkpoint,
so `--resume` continues with exactly the losses an uninterrupted run would have had.
"""
from .checkpoint import BEST_DIR, CHECKPOINT_FILE, LOG_FILE  # noqa: F401
from .config import (DROPOUT_FREE_PASSES, HEAVY_DROPOUT, HEAVY_DROPOUT_PASSES, PRESETS,  # noqa: F401
                     TRAIN_DEFAULTS, ModelConfig)
from .tasks import ReverseTask  # noqa: F401
from .training.builtin import train_builtin  # noqa: F401
from .training.data import (CORPUS_READING_FLAGS, check_prepared_flags, choose_languages,  # noqa: F401
                            choose_vocab_size, open_corpus, prepared_dir)
from .training.flags import (BUILTIN_ONLY_ARGS, DATA_ONLY_ARGS, SIZE_FLAGS, TRAJECTORY_ARGS,  # noqa: F401
                             apply_defaults, corpus_blame, data_specs, describe_data, has_data,
                             model_config_from_args, refuse_flags_that_do_not_apply)
from .training.loop import REPLICA_CHECK_EVERY, NonFiniteLoss, StopFlag, Trainer, TrainState  # noqa: F401
from .training.on_data import train_on_data  # noqa: F401
from .training.report import describe  # noqa: F401
from .training.resume import (default_out_dir, load_initial_model, load_resume,  # noqa: F401
                              prepare_out_dir)
from .training.schedule import (FINAL_LR_SHARE, MIN_WARMUP, PEAK_LR_FACTOR, PROBE_STEPS,  # noqa: F401
                                SNAPSHOT_SHARE, WARMUP_SHARE)
from .translation import (CLAUSE_ENDS, CLOSERS, SENTENCE_ENDS, decode_pieces, score_translations,  # noqa: F401
                          split_to_fit, text_pieces, translate_texts)
