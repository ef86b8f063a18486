"""The attention engine: the attention function anchorlens registers, below the methods and the capture.

It owns the normalised call (:mod:`~anchorlens.engine.call`), visibility and the probabilities
(:mod:`~anchorlens.engine.probs`), the output paths (:mod:`~anchorlens.engine.output`), the per-head value norms
(:mod:`~anchorlens.engine.value_norms`) and the function itself with its install on a model
(:mod:`~anchorlens.engine.attention`). What acts on a call comes in through one context variable
(:mod:`~anchorlens.engine.context`): an edit (:class:`~anchorlens.engine.edit.AttentionEditor`, the knockouts of
:mod:`anchorlens.methods.knockout`) and an observer (:class:`~anchorlens.engine.observer.Observer`, the capture
session of :mod:`anchorlens.capture.session`). The engine never imports either of them.
"""
