"""control plane core and weight catalog

Tokens, audit, events, topology, the snapshot counter (seeded at 0) and
the weight catalog. Written by autogenerate, then read and seeded by hand.

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 09:25:44.451143
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('token_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=160), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_sha256', name=op.f('uq_api_tokens_token_sha256'))
    )
    op.create_table('audit_records',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('actor', sa.String(length=160), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('action', sa.String(length=160), nullable=False),
    sa.Column('target', sa.String(length=1000), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_records'))
    )
    with op.batch_alter_table('audit_records', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_records_actor'), ['actor'], unique=False)
        batch_op.create_index(batch_op.f('ix_audit_records_at'), ['at'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('routing_tier', sa.String(length=8), nullable=True),
    sa.Column('actor', sa.String(length=160), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('scope', sa.String(length=400), nullable=False),
    sa.Column('before', sa.JSON(), nullable=True),
    sa.Column('after', sa.JSON(), nullable=True),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("routing_tier IS NULL OR routing_tier IN ('l7', 'mesh', 'zone', 'dns')", name=op.f('ck_events_routing_tier')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events'))
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_actor'), ['actor'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_kind'), ['kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_routing_tier'), ['routing_tier'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_scope'), ['scope'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_started_at'), ['started_at'], unique=False)

    op.create_table('regions',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_regions'))
    )
    op.create_table('snapshot_counter',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('changed_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_snapshot_counter'))
    )
    op.bulk_insert(
        sa.table("snapshot_counter", sa.column("id", sa.Integer), sa.column("version", sa.Integer)),
        [{"id": 1, "version": 0}],
    )
    op.create_table('weight_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('version', sa.String(length=128), nullable=False),
    sa.Column('location', sa.String(length=1000), nullable=False),
    sa.Column('total_bytes', sa.BigInteger(), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('fingerprint_parts', sa.JSON(), nullable=False),
    sa.Column('registered_by', sa.String(length=160), nullable=False),
    sa.Column('registered_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_weight_versions')),
    sa.UniqueConstraint('model', 'version', name=op.f('uq_weight_versions_model_version'))
    )
    with op.batch_alter_table('weight_versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_weight_versions_model'), ['model'], unique=False)

    op.create_table('alias_moves',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('alias', sa.String(length=128), nullable=False),
    sa.Column('action', sa.String(length=16), nullable=False),
    sa.Column('from_version_id', sa.Integer(), nullable=True),
    sa.Column('to_version_id', sa.Integer(), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('forced', sa.Boolean(), nullable=False),
    sa.Column('actor', sa.String(length=160), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('moved_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('event_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['event_id'], ['events.id'], name=op.f('fk_alias_moves_event_id_events')),
    sa.ForeignKeyConstraint(['from_version_id'], ['weight_versions.id'], name=op.f('fk_alias_moves_from_version_id_weight_versions')),
    sa.ForeignKeyConstraint(['to_version_id'], ['weight_versions.id'], name=op.f('fk_alias_moves_to_version_id_weight_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alias_moves'))
    )
    with op.batch_alter_table('alias_moves', schema=None) as batch_op:
        batch_op.create_index('ix_alias_moves_model_alias', ['model', 'alias'], unique=False)

    op.create_table('aliases',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['version_id'], ['weight_versions.id'], name=op.f('fk_aliases_version_id_weight_versions'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_aliases')),
    sa.UniqueConstraint('model', 'name', name=op.f('uq_aliases_model_name'))
    )
    with op.batch_alter_table('aliases', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_aliases_model'), ['model'], unique=False)

    op.create_table('instance_ejections',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('region', sa.String(length=128), nullable=False),
    sa.Column('instance_id', sa.String(length=128), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('actor', sa.String(length=160), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['region'], ['regions.name'], name=op.f('fk_instance_ejections_region_regions'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_instance_ejections')),
    sa.UniqueConstraint('region', 'instance_id', 'generation', name=op.f('uq_instance_ejections_region_instance_id_generation'))
    )
    with op.batch_alter_table('instance_ejections', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_instance_ejections_region'), ['region'], unique=False)

    op.create_table('known_issues',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('severity', sa.String(length=16), nullable=False),
    sa.Column('title', sa.String(length=400), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('opened_by', sa.String(length=160), nullable=False),
    sa.Column('opened_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('resolved_by', sa.String(length=160), nullable=True),
    sa.Column('resolved_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('resolution', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['version_id'], ['weight_versions.id'], name=op.f('fk_known_issues_version_id_weight_versions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_known_issues'))
    )
    with op.batch_alter_table('known_issues', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_known_issues_version_id'), ['version_id'], unique=False)

    op.create_table('serving_clusters',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('region', sa.String(length=128), nullable=False),
    sa.Column('zone', sa.String(length=128), nullable=True),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('endpoint', sa.String(length=1000), nullable=False),
    sa.Column('weight', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['region'], ['regions.name'], name=op.f('fk_serving_clusters_region_regions'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_serving_clusters'))
    )
    with op.batch_alter_table('serving_clusters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_serving_clusters_model'), ['model'], unique=False)
        batch_op.create_index(batch_op.f('ix_serving_clusters_region'), ['region'], unique=False)

    op.create_table('weight_shards',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('path', sa.String(length=1000), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['version_id'], ['weight_versions.id'], name=op.f('fk_weight_shards_version_id_weight_versions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_weight_shards')),
    sa.UniqueConstraint('version_id', 'path', name=op.f('uq_weight_shards_version_id_path'))
    )
    with op.batch_alter_table('weight_shards', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_weight_shards_version_id'), ['version_id'], unique=False)

    op.create_table('zones',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('region', sa.String(length=128), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['region'], ['regions.name'], name=op.f('fk_zones_region_regions'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_zones')),
    sa.UniqueConstraint('region', 'name', name=op.f('uq_zones_region_name'))
    )
    with op.batch_alter_table('zones', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_zones_region'), ['region'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('zones', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_zones_region'))

    op.drop_table('zones')
    with op.batch_alter_table('weight_shards', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_weight_shards_version_id'))

    op.drop_table('weight_shards')
    with op.batch_alter_table('serving_clusters', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_serving_clusters_region'))
        batch_op.drop_index(batch_op.f('ix_serving_clusters_model'))

    op.drop_table('serving_clusters')
    with op.batch_alter_table('known_issues', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_known_issues_version_id'))

    op.drop_table('known_issues')
    with op.batch_alter_table('instance_ejections', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_instance_ejections_region'))

    op.drop_table('instance_ejections')
    with op.batch_alter_table('aliases', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_aliases_model'))

    op.drop_table('aliases')
    with op.batch_alter_table('alias_moves', schema=None) as batch_op:
        batch_op.drop_index('ix_alias_moves_model_alias')

    op.drop_table('alias_moves')
    with op.batch_alter_table('weight_versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_weight_versions_model'))

    op.drop_table('weight_versions')
    op.drop_table('snapshot_counter')
    op.drop_table('regions')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_started_at'))
        batch_op.drop_index(batch_op.f('ix_events_scope'))
        batch_op.drop_index(batch_op.f('ix_events_routing_tier'))
        batch_op.drop_index(batch_op.f('ix_events_kind'))
        batch_op.drop_index(batch_op.f('ix_events_actor'))

    op.drop_table('events')
    with op.batch_alter_table('audit_records', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_records_at'))
        batch_op.drop_index(batch_op.f('ix_audit_records_actor'))

    op.drop_table('audit_records')
    op.drop_table('api_tokens')
