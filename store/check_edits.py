"""A migration's change to the values a CHECK allows on ``column IN (...)``. PostgreSQL drops and
recreates the named constraint. SQLite cannot alter a constraint, and rebuilding the table
(copy, drop, rename) fails on the foreign keys of the rows that refer to it; so, as SQLite's
documentation describes for changes that leave the stored rows valid ("Making Other Kinds Of
Table Schema Changes"), the CHECK's text in the schema is replaced in place, after checking
that every stored value is allowed."""

from __future__ import annotations

from alembic import op


def values_in(column: str, values: tuple[str, ...]) -> str:
    """The CHECK expression ``column IN ('a', 'b', ...)`` as the migrations write it."""
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def replace_check(table: str, column: str, constraint: str, old: tuple[str, ...],
                  new: tuple[str, ...]) -> None:
    """Make ``table``'s CHECK ``constraint`` allow ``new`` instead of ``old`` values of
    ``column``; a stored value ``new`` does not allow is refused with an error naming it."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(op.f(constraint), type_="check")
            batch_op.create_check_constraint(op.f(constraint), values_in(column, new))
        return
    outside = bind.exec_driver_sql(
        f"SELECT DISTINCT {column} FROM {table} WHERE NOT {values_in(column, new)}"
    ).scalars().all()
    if outside:
        raise RuntimeError(f"{table}: stored {column} values {sorted(map(str, outside))} are "
                           "not allowed after this migration; change or delete those rows first")
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    changed = bind.exec_driver_sql(
        "UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE type = 'table' AND "
        "name = ? AND instr(sql, ?) > 0",
        (values_in(column, old), values_in(column, new), table, values_in(column, old))).rowcount
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")
    if changed != 1:
        raise RuntimeError(f"{table}: the CHECK of its {column} was not found as the "
                           "migrations wrote it")
