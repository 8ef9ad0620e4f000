"""The process room: what every Brain and Hands process starts with and runs by: the one settings
object (``settings``), the one logger setup (``logging``), traces (``tracing``), the commands'
first steps (``entry``), waiting for services at start (``startup``), kill points (``killpoints``),
the collector settings of a served process (``heap``) and in-process listeners (``listeners``)."""
