"""The transport room: how Brain and Hands send each other messages.

=================  ==========================================================================
module             what it holds
=================  ==========================================================================
``contract``       what Brain and Hands need from a transport (structural types), the topology
``broker``         RabbitMQ (aio-pika): quorum queues, confirms, consumers
``coalesce``       the frames of one turn of the event loop in one send
``quickack``       deliveries straight from aiormq, with acks that do not wait
``localqueue``     the embedded mode's durable queues in one SQLite file
``delivery``       settling a delivery whatever happens
``parked``         what a dead-letter queue holds, read back and surfaced
=================  ==========================================================================
"""

from infra.transport.contract import (
    REASON_HEADER,
    Consumer,
    Delivery,
    DeliveryHandler,
    Topology,
    Transport,
)

__all__ = ["REASON_HEADER", "Consumer", "Delivery", "DeliveryHandler", "Topology", "Transport"]
