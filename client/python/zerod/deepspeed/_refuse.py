"""How the DeepSpeed namespace refuses what zerod does not serve: at use, naming the feature,
so that a script that imports it without using it (an MoE helper imported at the top of a
dense model's script) still runs."""


def refuse(feature, hint=None):
    raise NotImplementedError(
        "zerod serves DeepSpeed's ZeRO stages 1 and 2 (data parallel, Adam/AdamW on the "
        "daemons): %s is not supported%s" % (feature, "; " + hint if hint else ""))


def refusing_class(name, feature, hint=None):
    """A class of DeepSpeed's API whose construction refuses."""
    def __init__(self, *args, **kwargs):
        refuse(feature, hint)
    return type(name, (), {"__init__": __init__, "__doc__": "Not served by zerod: %s." % feature})


def refusing_function(name, feature, hint=None):
    def fn(*args, **kwargs):
        refuse(feature, hint)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = "Not served by zerod: %s." % feature
    return fn
