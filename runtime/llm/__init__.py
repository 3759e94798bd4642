"""The provider boundary: the replier (one chat request), the litellm-to-domain error mapping,
vision capability and image transcription.
"""

from runtime.llm._embedder import (
    LiteLLMEmbedder,
    Spend,
    current_spend,
    is_api_model,
    metered,
    provider_batch,
)
from runtime.llm._errors import error_class_for, map_model_error, retry_after
from runtime.llm._image_encode import EDGES, QUALITIES, EncodedImage, fit_image
from runtime.llm._replier import LiteLLMReplier, Replier, Reply, RetryPolicy, Tools, model_window
from runtime.llm._rerank import (
    CrossEncoderReranker,
    LiteLLMReranker,
    Reranker,
    open_reranker,
    rerank_ranked,
    rerank_within,
)
from runtime.llm._transcribe import ImageInput, Transcriber, batch_timeout, split_reply, tesseract_text
from runtime.llm._usage import cache_marks, cache_points, marks_cache
from runtime.llm._vision import catalog_says, family, heuristic_says, image_tokens, sees_images

__all__ = [
    "CrossEncoderReranker",
    "LiteLLMEmbedder",
    "LiteLLMReranker",
    "Reranker",
    "Spend",
    "current_spend",
    "is_api_model",
    "metered",
    "open_reranker",
    "provider_batch",
    "rerank_ranked",
    "rerank_within",
    "EDGES",
    "EncodedImage",
    "ImageInput",
    "LiteLLMReplier",
    "QUALITIES",
    "Replier",
    "Reply",
    "RetryPolicy",
    "Tools",
    "Transcriber",
    "batch_timeout",
    "cache_marks",
    "cache_points",
    "marks_cache",
    "catalog_says",
    "error_class_for",
    "family",
    "fit_image",
    "heuristic_says",
    "image_tokens",
    "map_model_error",
    "model_window",
    "retry_after",
    "sees_images",
    "split_reply",
    "tesseract_text",
]
