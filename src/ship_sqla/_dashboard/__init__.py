"""The operator dashboard (issue 15, S1, S2): an ASGI application over the operator surfaces."""

from ship_sqla._dashboard._app import DashboardAuthorizer as DashboardAuthorizer
from ship_sqla._dashboard._app import create_dashboard as create_dashboard

__all__ = ["DashboardAuthorizer", "create_dashboard"]
