from ship_sqla._alembic import ship_include_object as ship_include_object
from ship_sqla._rls import tenant_policy_ddl as tenant_policy_ddl
from ship_sqla._schema_check import SchemaDifference as SchemaDifference
from ship_sqla._schema_check import SchemaReport as SchemaReport
from ship_sqla._schema_check import check_schema as check_schema
from ship_sqla._schema_sql import schema_sql as schema_sql
from ship_sqla._storage_options import storage_options as storage_options
from ship_sqla._storage_options import storage_options_ddl as storage_options_ddl

__all__ = (
    "SchemaDifference",
    "SchemaReport",
    "check_schema",
    "schema_sql",
    "ship_include_object",
    "storage_options",
    "storage_options_ddl",
    "tenant_policy_ddl",
)
