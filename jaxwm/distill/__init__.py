"""Few-step distillation of the streaming model into a LoRA adapter (ReWorld §2.4): distribution-matching
distillation with self-forcing rollouts (:mod:`jaxwm.distill.dmd`), its run loop
(:mod:`jaxwm.distill.loop`) and loading a distilled adapter for sampling (:mod:`jaxwm.distill.student`)."""
