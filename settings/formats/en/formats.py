"""Date formats for the admin (English locale): every time to the second, with its zone (UTC,
TIME_ZONE): an operator compares these with the rail's statement."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
