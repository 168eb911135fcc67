"""The one edge of the three apps (feedback, inference, gateway): what each of them would otherwise
write again. Building an app around its service object (`app`), who is calling (`auth`), errors and
their two wire formats (`errors`), the operations routes (`health`), what is refused before any
handler runs (`limits`), and starting a service (`serve`). An app's own routes, state and library
exceptions stay in its package; only `serve_named`, the command line's door, names the apps.
"""

from services.common.app import app_service, edge_app
from services.common.auth import require_scope
from services.common.errors import ApiError, feedback_body, install_errors, openai_body, openai_errors
from services.common.health import health_router
from services.common.limits import BodyLimit
from services.common.serve import require_api_keys, serve, serve_named

__all__ = ["ApiError", "BodyLimit", "app_service", "edge_app", "feedback_body", "health_router",
           "install_errors", "openai_body", "openai_errors", "require_api_keys", "require_scope", "serve",
           "serve_named"]
