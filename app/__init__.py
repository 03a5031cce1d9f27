"""rksim command line, Streamlit dashboard and HTML report."""
