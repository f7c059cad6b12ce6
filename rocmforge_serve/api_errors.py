"""Errors as the OpenAI API returns them: a status code and {"error": {"message", "type", "param", "code"}}.

Every failure a client can cause or see comes back in this one shape, so the official client raises its
usual exception types (BadRequestError, AuthenticationError, RateLimitError ...) with our message.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

MESSAGE_CHARS = 2000  # an error message quotes client or model text at most this long


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message[:MESSAGE_CHARS]
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def server_error(message: str) -> ApiError:
    return ApiError(500, message, type="server_error", code="internal_error")


def unavailable(message: str, retry_after_s: int = 1) -> ApiError:
    return ApiError(503, message, type="server_error", code="unavailable", headers={"Retry-After": str(retry_after_s)})
