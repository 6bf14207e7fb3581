from ship_sqla.kernel._consumer_metrics import CONSUMER_METRIC_NAMES as CONSUMER_METRIC_NAMES
from ship_sqla.kernel._consumers import DEFAULT_CONSUMER_BATCH as DEFAULT_CONSUMER_BATCH
from ship_sqla.kernel._consumers import MAX_CONSUMER_BATCH as MAX_CONSUMER_BATCH
from ship_sqla.kernel._consumers import Consumer as Consumer
from ship_sqla.kernel._consumers import ConsumerCursor as ConsumerCursor
from ship_sqla.kernel._consumers import ConsumerProgress as ConsumerProgress
from ship_sqla.kernel._consumers import define_consumer as define_consumer

__all__ = (
    "CONSUMER_METRIC_NAMES",
    "DEFAULT_CONSUMER_BATCH",
    "MAX_CONSUMER_BATCH",
    "Consumer",
    "ConsumerCursor",
    "ConsumerProgress",
    "define_consumer",
)
