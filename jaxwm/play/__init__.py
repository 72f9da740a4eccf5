"""The interactive viewer: ``jaxwm-play`` (:mod:`jaxwm.play.server`), its page (:mod:`jaxwm.play.page`) and the
model side of a walk (:mod:`jaxwm.play.engine`)."""
