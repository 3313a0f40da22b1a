"""deepspeed.utils.logging: DeepSpeed's "DeepSpeed" logger (stdout, WARNING) and log_dist."""
import functools
import logging
import sys


def _create_logger(name, level=logging.WARNING):
    log = logging.getLogger(name)
    if not log.handlers:  # once per process, whichever name imported it first
        log.setLevel(level)
        log.propagate = False
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setFormatter(logging.Formatter(
            "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"))
        log.addHandler(handler)
    return log


logger = _create_logger("DeepSpeed")


@functools.lru_cache(None)
def warning_once(*args, **kwargs):
    logger.warning(*args, **kwargs)


logger.warning_once = warning_once


def _dist_msg(message, ranks):
    """"[Rank r] message" when this rank should log it: always before init_distributed,
    else when ranks holds this rank or starts with -1."""
    import torch.distributed as td
    up = td.is_available() and td.is_initialized()
    rank = td.get_rank() if up else -1
    ranks = ranks or []
    if up and not (ranks and (ranks[0] == -1 or rank in ranks)):
        return None
    return "[Rank %d] %s" % (rank, message)


def log_dist(message, ranks=None, level=logging.INFO):
    msg = _dist_msg(message, ranks)
    if msg is not None:
        logger.log(level, msg)


def print_dist(message, ranks=None):
    msg = _dist_msg(message, ranks)
    if msg is not None:
        print(msg)


@functools.lru_cache(None)
def _log_dist_once(message, ranks, level):
    log_dist(message, list(ranks) if ranks is not None else None, level)


def log_dist_once(message, ranks=None, level=logging.INFO):
    _log_dist_once(message, tuple(ranks) if ranks is not None else None, level)


logger.log_dist_once = log_dist_once


def set_log_level_from_string(log_level_str, custom_logger=None):
    level = getattr(logging, str(log_level_str).upper(), None)
    if not isinstance(level, int):
        raise ValueError("zerod: invalid log level %r" % (log_level_str,))
    (custom_logger or logger).setLevel(level)


def print_configuration(args, name):
    logger.info("%s:", name)
    for arg in sorted(vars(args)):
        logger.info("  %s %s %s", arg, "." * (29 - len(arg)), getattr(args, arg))
