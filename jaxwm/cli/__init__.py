"""The command-line tools: ``jaxwm.cli.train`` (``python train.py``, ``jaxwm-train``) and ``jaxwm.cli.sample``
(``python sample.py``, ``jaxwm-sample``). Each has ``main(argv=None)``: a list runs in this process and returns the
exit code."""
