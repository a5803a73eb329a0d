"""Old dotted path of the middleware (``--middleware`` user configuration)."""

from autellix_vllm.engine.middleware import IdentityMiddleware

__all__ = ["IdentityMiddleware"]
