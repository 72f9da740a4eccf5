"""``jaxwm-parity``: the user's own weights in the PyTorch reference and in jaxwm, compared tensor by tensor.

One module per model (:mod:`~jaxwm.parity.transformer`: diffusers' ``WanTransformer3DModel``;
:mod:`~jaxwm.parity.vae`: diffusers' ``AutoencoderKLWan``; :mod:`~jaxwm.parity.text`: transformers'
``UMT5EncoderModel``), each with ``check(path, ...) -> Report`` (:mod:`~jaxwm.parity.report`); the command is
:mod:`jaxwm.cli.parity`.
"""

CHECKS = {"transformer": "jaxwm.parity.transformer", "vae": "jaxwm.parity.vae", "text": "jaxwm.parity.text"}
